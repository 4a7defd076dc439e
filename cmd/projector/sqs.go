package main

import (
	"flag"
	"strings"
	"time"

	"github.com/projector/projector/projection"
)

// Sources `projector run` and `projector demo` read from.
const (
	sourceKafka = projection.SourceKafka
	sourceSQS   = projection.SourceSQS
)

// sqsFlags choose the source and, for SQS, the queue and how it is read.
type sqsFlags struct {
	source      string
	queueURL    string
	endpoint    string
	region      string
	wait        time.Duration
	visibility  time.Duration
	maxMessages int
}

func (s *sqsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.source, "source", sourceKafka, "where job events come from: kafka (a topic, --brokers) or sqs (an SQS FIFO\nqueue, --sqs-queue-url)")
	s.registerQueue(fs, "with --source sqs: the queue's URL (required), e.g.", "with --source sqs: ")
	fs.DurationVar(&s.wait, "sqs-wait", projection.DefaultSQSWait, "with --source sqs: long poll of one receive, whole seconds from 0s to 20s")
	fs.DurationVar(&s.visibility, "sqs-visibility", projection.DefaultSQSVisibility, "with --source sqs: how long a received message stays hidden from other\nconsumers (whole seconds, 1s to 12h); extended while its batch is in flight,\nand the message is deleted only after its batch committed")
	fs.IntVar(&s.maxMessages, "sqs-max-messages", projection.DefaultSQSMaxMessages, "with --source sqs: most messages one receive returns, 1 to 10")
}

// registerQueue adds the flags that name the queue and reach it: status
// takes these alone (it receives nothing). url is the queue URL's help,
// when the start of the others'.
func (s *sqsFlags) registerQueue(fs *flag.FlagSet, url, when string) {
	fs.StringVar(&s.queueURL, "sqs-queue-url", "", url+"\nhttps://sqs.eu-west-1.amazonaws.com/123456789012/job-events.fifo")
	fs.StringVar(&s.endpoint, "sqs-endpoint", "", when+"base URL of every SQS request instead of the region's\n(an emulator or a VPC endpoint), e.g. http://127.0.0.1:4566")
	fs.StringVar(&s.region, "sqs-region", "", when+"the queue's AWS region (default from AWS_REGION or the\nshared config, else from the queue URL); credentials come from the standard\nAWS chain (environment, shared files, instance or task role)")
}

// validate says which flag to fix; it checks the SQS flags only with
// --source sqs.
func (s *sqsFlags) validate() error {
	switch s.source {
	case sourceKafka, "":
		return nil
	case sourceSQS:
	default:
		return usagef("--source %q: want kafka or sqs", s.source)
	}
	// Zero would take the default in projection: refuse it here.
	if s.visibility == 0 {
		return usagef("--sqs-visibility 0s: want whole seconds from 1s to 12h (SQS's visibility timeout)")
	}
	if s.maxMessages == 0 {
		return usagef("--sqs-max-messages 0: SQS returns 1 to 10 messages per receive")
	}
	if err := s.config().Validate(); err != nil {
		// projection names the setting; the command line names the flag.
		// Each of several problems names its flag.
		parts := strings.Split(err.Error(), "\n")
		for i, part := range parts {
			for _, name := range []string{"sqs-queue-url", "sqs-endpoint", "sqs-wait", "sqs-visibility", "sqs-max-messages"} {
				if strings.HasPrefix(part, name) {
					parts[i] = "--" + part
					break
				}
			}
		}
		return usagef("%s", strings.Join(parts, "; "))
	}
	return nil
}

// config is the queue's settings. --sqs-wait 0 polls without waiting.
func (s *sqsFlags) config() projection.SQS {
	return projection.SQS{QueueURL: s.queueURL, Endpoint: s.endpoint, Region: s.region,
		Wait: s.wait, ShortPoll: s.wait == 0, Visibility: s.visibility, MaxMessages: s.maxMessages}
}
