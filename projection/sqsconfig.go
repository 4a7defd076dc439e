package projection

import (
	"context"

	sqssrc "github.com/projector/projector/source/sqs"
)

// The SQS source lives in source/sqs; these are its names as the engine's
// callers have known them.
type (
	// SQS is an SQS FIFO queue the projector reads, and how ([sqssrc.Config]).
	SQS = sqssrc.Config
	// SQSCounts are a queue's approximate counts ([sqssrc.Counts]).
	SQSCounts = sqssrc.Counts
	// SQSCounters are what an instance's receiver saw ([sqssrc.Counters]).
	SQSCounters = sqssrc.Counters
	// SQSAuthError is SQS refusing the credentials ([sqssrc.AuthError]).
	SQSAuthError = sqssrc.AuthError
)

// SQS defaults ([sqssrc.DefaultWait]).
const (
	DefaultSQSWait        = sqssrc.DefaultWait
	DefaultSQSVisibility  = sqssrc.DefaultVisibility
	DefaultSQSMaxMessages = sqssrc.DefaultMaxMessages
	NoSQSWait             = sqssrc.NoWait
)

// QueueCounts is [sqssrc.QueueCounts].
func QueueCounts(ctx context.Context, s SQS) (SQSCounts, error) { return sqssrc.QueueCounts(ctx, s) }
