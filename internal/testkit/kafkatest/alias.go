package kafkatest

import "github.com/projector/projector/internal/app/broker"

// The broker's API under this package's name; see internal/app/broker.
type (
	Cluster = broker.Cluster
	Record  = broker.Record
	Option  = broker.Option
)

var (
	Start                 = broker.Start
	Connect               = broker.Connect
	WithBrokers           = broker.WithBrokers
	WithDefaultPartitions = broker.WithDefaultPartitions
	WithKfakeOptions      = broker.WithKfakeOptions
	WithClientSecurity    = broker.WithClientSecurity
)

const (
	DefaultPartitions           = broker.DefaultPartitions
	GroupHeartbeatInterval      = broker.GroupHeartbeatInterval
	GroupSessionTimeout         = broker.GroupSessionTimeout
	GroupRebalanceTimeout       = broker.GroupRebalanceTimeout
	GroupJoinBackoff            = broker.GroupJoinBackoff
	GroupPartitionWatchInterval = broker.GroupPartitionWatchInterval
)
