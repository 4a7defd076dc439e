// Package sqscfg holds the SQS source's settings and reports, apart from
// the AWS SDK, so that a configuration or a status can hold them without
// linking it.
package sqscfg

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Config is an SQS FIFO queue the projector reads instead of a Kafka topic,
// and how it reads it. Zero fields take the defaults of
// [Config.WithDefaults]; [Config.Validate] says what to fix.
type Config struct {
	// QueueURL is the queue's URL (required).
	QueueURL string
	// Endpoint, when set, is the base URL every request goes to instead of
	// the region's: an emulator or a VPC endpoint.
	Endpoint string
	// Region is the queue's AWS region; empty takes it from the standard
	// chain (AWS_REGION, the shared config), else from the queue URL.
	Region string
	// Wait is the long poll of one receive, at most 20s (zero: 20s);
	// ShortPoll polls without waiting.
	Wait      time.Duration
	ShortPoll bool
	// Visibility is how long a received message stays hidden from other
	// consumers; it is extended while the message's batch is in flight.
	Visibility time.Duration
	// MaxMessages is the most messages one receive returns: 1 to 10.
	MaxMessages int
	// Credentials, when set, replace the standard credential chain (the
	// demo and the tests, against the emulator).
	Credentials *Credentials

	// queue is QueueURL parsed, by WithDefaults: the name, the region and
	// the checks all read it, once.
	queue *queueURL
}

// queueURL is a queue URL parsed, for the URL it was parsed from.
type queueURL struct {
	raw string
	u   *url.URL
	err error
}

// parsed is QueueURL parsed: as WithDefaults parsed it, or now when it did
// not (or the URL changed since).
func (s Config) parsed() (*url.URL, error) {
	if q := s.queue; q != nil && q.raw == s.QueueURL {
		return q.u, q.err
	}
	return url.Parse(s.QueueURL)
}

// Host is the queue URL's host, empty when it does not parse.
func (s Config) Host() string {
	u, err := s.parsed()
	if err != nil {
		return ""
	}
	return u.Host
}

// Credentials are static AWS credentials.
type Credentials struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// SQS defaults and bounds, as SQS itself sets them.
const (
	DefaultWait        = 20 * time.Second
	DefaultVisibility  = 60 * time.Second
	DefaultMaxMessages = 10
	maxWait            = 20 * time.Second
	maxVisibility      = 12 * time.Hour
)

// WithDefaults returns s with its zero fields set.
func (s Config) WithDefaults() Config {
	if s.Wait == 0 && !s.ShortPoll {
		s.Wait = DefaultWait
	}
	if s.Visibility == 0 {
		s.Visibility = DefaultVisibility
	}
	if s.MaxMessages == 0 {
		s.MaxMessages = DefaultMaxMessages
	}
	if s.queue == nil || s.queue.raw != s.QueueURL {
		u, err := url.Parse(s.QueueURL)
		s.queue = &queueURL{raw: s.QueueURL, u: u, err: err}
	}
	return s
}

// Validate says what is wrong with s, naming the flag to fix.
func (s Config) Validate() error {
	var errs []error
	if s.QueueURL == "" {
		errs = append(errs, errors.New("sqs-queue-url: required with --source sqs: the queue's URL, e.g. https://awssqs.eu-west-1.amazonaws.com/123456789012/job-events.fifo"))
	} else if u, err := s.parsed(); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("sqs-queue-url %q: not an http or https URL, e.g. https://awssqs.eu-west-1.amazonaws.com/123456789012/job-events.fifo", s.QueueURL))
	}
	if s.Endpoint != "" {
		if u, err := url.Parse(s.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("sqs-endpoint %q: not an http or https URL, e.g. http://127.0.0.1:4566", s.Endpoint))
		}
	}
	if s.ShortPoll && s.Wait != 0 {
		errs = append(errs, fmt.Errorf("sqs-wait %s given with ShortPoll (which polls without waiting): set one of them", s.Wait))
	}
	if !s.ShortPoll && (s.Wait < 0 || s.Wait > maxWait || s.Wait%time.Second != 0) {
		errs = append(errs, fmt.Errorf("sqs-wait %s: want whole seconds from 0s to 20s (SQS's long poll)", s.Wait))
	}
	if s.Visibility < time.Second || s.Visibility > maxVisibility || s.Visibility%time.Second != 0 {
		errs = append(errs, fmt.Errorf("sqs-visibility %s: want whole seconds from 1s to 12h (SQS's visibility timeout)", s.Visibility))
	}
	if s.MaxMessages < 1 || s.MaxMessages > 10 {
		errs = append(errs, fmt.Errorf("sqs-max-messages %d: SQS returns 1 to 10 messages per receive", s.MaxMessages))
	}
	return errors.Join(errs...)
}

// Name is the queue's name, the last element of its URL: the projection's
// "topic" in the store (positions, held and quarantine rows).
func (s Config) Name() string {
	u, err := s.parsed()
	if err != nil || u.Path == "" {
		return s.QueueURL
	}
	name := u.Path
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			name = name[i+1:]
			break
		}
	}
	if name == "" {
		return s.QueueURL
	}
	return "sqs:" + name
}

// SQSAuthError means SQS refused the projector's credentials, or their
// permission on the queue: retrying cannot fix that, so the engine stops
// (`projector run` exits 1) rather than wait as for an outage, as it does
// when Kafka brokers refuse it (the Kafka source's AuthError).
type AuthError struct {
	// Code is SQS's error code, e.g. InvalidClientTokenId.
	Code string
	Err  error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("sqs: credentials refused (%s): fix the AWS credentials (environment, shared files, role) or their permissions on the queue: %v", e.Code, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }

// SQSCounts are a queue's approximate message counts: visible (waiting to
// be received) and in flight (received, not yet deleted). Their sum is the
// SQS source's lag.
type Counts struct {
	Visible  int64 `json:"visible"`
	InFlight int64 `json:"in_flight"`
}

// SQSCounters are the SQS source's counters.
type Counters struct {
	Received           int64 `json:"received"`
	Redelivered        int64 `json:"redelivered"`
	GroupNotJobID      int64 `json:"group_not_job_id"`
	Deleted            int64 `json:"deleted"`
	DeleteFailed       int64 `json:"delete_failed"`
	VisibilityFailures int64 `json:"visibility_extend_failed"`
}

// OwnerTag is the queue tag that names the projection whose queue it is
// (its id and name), so that a second projection is refused the queue.
const OwnerTag = "projector-projection"

// Status is a queue's report in /status.
type Status struct {
	QueueURL string `json:"queue_url"`
	// Counts are the queue's approximate counts as last read (every 5 s);
	// nil while unknown: before the first read, or since a read failed,
	// with CountsError saying why.
	Counts      *Counts  `json:"counts"`
	CountsError string   `json:"counts_error,omitempty"`
	Counters    Counters `json:"counters"`
}
