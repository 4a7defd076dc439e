package broker

import (
	"time"

	"github.com/segmentio/kafka-go"
)

// Consumer-group timings for the in-process broker. kafka-go's defaults
// (heartbeat 3 s, session 30 s, rebalance 30 s, join backoff 5 s, partition
// watch 5 s) make every rebalance in a test take seconds; with these a member
// leaving or joining is absorbed in about two heartbeats.
//
// How a rebalance runs here, and so why each value: kfake (like Kafka's
// classic protocol) completes a rebalance as soon as every member has sent
// JoinGroup again, and waits at most the largest RebalanceTimeout for the
// stragglers. A kafka-go member learns of a rebalance only from its next
// heartbeat (REBALANCE_IN_PROGRESS ends the generation), so the
// HeartbeatInterval is the delay. The SessionTimeout matters only for a
// member that vanishes without LeaveGroup (ConsumerGroup.Close sends one);
// the broker must be told to accept values under its default 6 s minimum,
// which [Start] does. JoinGroupBackoff is slept after a failed join (for
// example UNKNOWN_MEMBER_ID after the broker dropped a slow member).
const (
	GroupHeartbeatInterval      = 100 * time.Millisecond
	GroupSessionTimeout         = 2 * time.Second
	GroupRebalanceTimeout       = 2 * time.Second
	GroupJoinBackoff            = 100 * time.Millisecond
	GroupPartitionWatchInterval = 200 * time.Millisecond
)

// GroupConfig returns a kafka-go consumer-group config for this cluster with
// the Group* timings above, partition watching on (a topic grown with
// [Cluster.AddPartitions] rebalances the group within
// GroupPartitionWatchInterval), and kafka-go's other defaults (range then
// round-robin balancers, FirstOffset for a partition with no commit).
func (c *Cluster) GroupConfig(groupID string, topics ...string) kafka.ConsumerGroupConfig {
	return kafka.ConsumerGroupConfig{
		ID:                     groupID,
		Brokers:                c.Addrs(),
		Topics:                 topics,
		Dialer:                 c.dialer,
		HeartbeatInterval:      GroupHeartbeatInterval,
		SessionTimeout:         GroupSessionTimeout,
		RebalanceTimeout:       GroupRebalanceTimeout,
		JoinGroupBackoff:       GroupJoinBackoff,
		WatchPartitionChanges:  true,
		PartitionWatchInterval: GroupPartitionWatchInterval,
	}
}
