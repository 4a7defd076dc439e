package projection

import (
	sqscfg "github.com/projector/projector/source/sqs/sqscfg"
)

// The SQS source lives in source/sqs, its settings in source/sqs/sqscfg;
// these are their names as the engine's
// callers have known them.
type (
	// SQS is an SQS FIFO queue the projector reads, and how ([sqscfg.Config]).
	SQS = sqscfg.Config
	// SQSCounts are a queue's approximate counts ([sqscfg.Counts]).
	SQSCounts = sqscfg.Counts
	// SQSCounters are what an instance's receiver saw ([sqscfg.Counters]).
	SQSCounters = sqscfg.Counters
	// SQSAuthError is SQS refusing the credentials ([sqscfg.AuthError]).
	SQSAuthError = sqscfg.AuthError
)

// SQS defaults ([sqscfg.DefaultWait]).
const (
	DefaultSQSWait        = sqscfg.DefaultWait
	DefaultSQSVisibility  = sqscfg.DefaultVisibility
	DefaultSQSMaxMessages = sqscfg.DefaultMaxMessages
)
