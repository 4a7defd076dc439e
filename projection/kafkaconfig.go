package projection

import (
	"github.com/projector/projector/source"
	kafkacfg "github.com/projector/projector/source/kafka/kafkacfg"
)

// The Kafka source lives in source/kafka, its settings in
// source/kafka/kafkacfg; these are their names as the engine's callers
// have known them.
type (
	// Kafka is where the brokers are and how to reach them ([kafkacfg.Config]).
	Kafka = kafkacfg.Config
	// SASL is a SASL mechanism and its credentials ([kafkacfg.SASL]).
	SASL = kafkacfg.SASL
	// AuthError is a broker refusing our credentials or certificate ([kafkacfg.AuthError]).
	AuthError = kafkacfg.AuthError
	// LogEnd is where one partition's log ends ([source.LogEnd]).
	LogEnd = source.LogEnd
)

// Isolation levels and SASL mechanisms ([kafkacfg.ReadCommitted], [kafkacfg.SASLPlain]).
const (
	ReadCommitted   = kafkacfg.ReadCommitted
	ReadUncommitted = kafkacfg.ReadUncommitted
	SASLPlain       = kafkacfg.SASLPlain
	SASLScramSHA256 = kafkacfg.SASLScramSHA256
	SASLScramSHA512 = kafkacfg.SASLScramSHA512
)
