package demo

// The demo runs on Kafka and on SQS: their sources register themselves
// when linked in.
import (
	_ "github.com/projector/projector/source/kafka"
	_ "github.com/projector/projector/source/sqs"
)
