package projection

import (
	"context"

	kafkasrc "github.com/projector/projector/source/kafka"
)

// The Kafka source lives in source/kafka; these are its names as the
// engine's callers have known them.
type (
	// Kafka is where the brokers are and how to reach them ([kafkasrc.Config]).
	Kafka = kafkasrc.Config
	// SASL is a SASL mechanism and its credentials ([kafkasrc.SASL]).
	SASL = kafkasrc.SASL
	// AuthError is a broker refusing our credentials or certificate ([kafkasrc.AuthError]).
	AuthError = kafkasrc.AuthError
	// LogEnd is where one partition's log ends ([kafkasrc.LogEnd]).
	LogEnd = kafkasrc.LogEnd
)

// Isolation levels and SASL mechanisms ([kafkasrc.ReadCommitted], [kafkasrc.SASLPlain]).
const (
	ReadCommitted   = kafkasrc.ReadCommitted
	ReadUncommitted = kafkasrc.ReadUncommitted
	SASLPlain       = kafkasrc.SASLPlain
	SASLScramSHA256 = kafkasrc.SASLScramSHA256
	SASLScramSHA512 = kafkasrc.SASLScramSHA512
)

// LogEnds is [kafkasrc.LogEnds].
func LogEnds(ctx context.Context, k Kafka, topic string) (map[int]LogEnd, error) {
	return kafkasrc.LogEnds(ctx, k, topic)
}

// LogStarts is [kafkasrc.LogStarts].
func LogStarts(ctx context.Context, k Kafka, topic string, partitions []int) (map[int]int64, error) {
	return kafkasrc.LogStarts(ctx, k, topic, partitions)
}
