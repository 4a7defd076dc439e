package projection

import (
	"context"

	"github.com/projector/projector/source"
	kafkasrc "github.com/projector/projector/source/kafka"
	sqssrc "github.com/projector/projector/source/sqs"
)

// source builds the source the configuration describes, when none was
// handed in ([Config.From]): the Kafka topic's consumer group, or the SQS
// queue. This is the one place the engine names a source.
func (c Config) source() (source.Source, error) {
	if c.Source == SourceSQS {
		// Builds the client only (the region and credential chain): the
		// queue is first asked at Run.
		return sqssrc.NewQueue(context.Background(), sqssrc.QueueConfig{Config: c.SQS, Scope: c.Topic, Owner: c.Owner,
			BatchSize: c.BatchSize, Linger: c.BatchLinger}, c.Logger)
	}
	st := c.Store
	return kafkasrc.NewGroup(kafkasrc.GroupConfig{
		Config: c.Kafka(), Topic: c.Topic, Group: c.Group, Fresh: DefaultGroup(st.Schema(), st.Projection()), Owner: c.Owner,
		HeartbeatInterval: c.HeartbeatInterval, SessionTimeout: c.SessionTimeout, RebalanceTimeout: c.RebalanceTimeout,
		JoinGroupBackoff: c.JoinGroupBackoff, PartitionWatchInterval: c.PartitionWatchInterval,
		MaxWait: c.MaxWait, BatchSize: c.BatchSize, Linger: c.BatchLinger,
		RereadMaxBytes: c.RereadMaxBytes, RereadMaxTime: c.RereadMaxTime,
	}, c.Logger)
}
