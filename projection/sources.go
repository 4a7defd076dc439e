package projection

import (
	"github.com/projector/projector/source"
)

// source builds the source the configuration describes, when none was
// handed in ([Config.From]): the one registered under Source ("kafka",
// "sqs"; see [source.Register]), from the settings below it. The engine
// names no source: a program links in those it offers.
func (c Config) source() (source.Source, error) {
	fresh := ""
	if st := c.Store; st != nil {
		fresh = DefaultGroup(st.Schema(), st.Projection())
	}
	return source.Build(c.Source, source.Settings{
		Topic: c.Topic, Group: c.Group, Fresh: fresh, Owner: c.Owner,
		Kafka: c.Kafka(), SQS: c.SQS,
		HeartbeatInterval: c.HeartbeatInterval, SessionTimeout: c.SessionTimeout, RebalanceTimeout: c.RebalanceTimeout,
		JoinGroupBackoff: c.JoinGroupBackoff, PartitionWatchInterval: c.PartitionWatchInterval,
		MaxWait: c.MaxWait, BatchSize: c.BatchSize, Linger: c.BatchLinger,
		RereadMaxBytes: c.RereadMaxBytes, RereadMaxTime: c.RereadMaxTime,
		Logger: c.Logger,
	})
}
