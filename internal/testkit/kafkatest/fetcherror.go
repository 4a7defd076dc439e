package kafkatest

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FetchErrorResponse answers a fetch request, for a kfake control
// function, with err's code for every partition it asks for.
func FetchErrorResponse(req kmsg.Request, err *kerr.Error) *kmsg.FetchResponse {
	r := req.(*kmsg.FetchRequest)
	resp := r.ResponseKind().(*kmsg.FetchResponse)
	for _, rt := range r.Topics {
		st := kmsg.NewFetchResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewFetchResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = err.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}
