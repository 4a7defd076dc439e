package sqs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	bigmath "math/big"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
)

// SQS is an SQS FIFO queue the projector reads instead of a Kafka topic,
// and how it reads it. Zero fields take the defaults of
// [SQS.WithDefaults]; [SQS.Validate] says what to fix.
type Config struct {
	// QueueURL is the queue's URL (required).
	QueueURL string
	// Endpoint, when set, is the base URL every request goes to instead of
	// the region's: an emulator or a VPC endpoint.
	Endpoint string
	// Region is the queue's AWS region; empty takes it from the standard
	// chain (AWS_REGION, the shared config), else from the queue URL.
	Region string
	// Wait is the long poll of one receive, at most 20s; NoSQSWait polls
	// without waiting.
	Wait time.Duration
	// Visibility is how long a received message stays hidden from other
	// consumers; it is extended while the message's batch is in flight.
	Visibility time.Duration
	// MaxMessages is the most messages one receive returns: 1 to 10.
	MaxMessages int
	// Credentials, when set, replace the standard credential chain (the
	// demo and the tests, against the emulator).
	Credentials aws.CredentialsProvider
}

// SQS defaults and bounds, as SQS itself sets them.
const (
	DefaultWait        = 20 * time.Second
	DefaultVisibility  = 60 * time.Second
	DefaultMaxMessages = 10
	maxWait            = 20 * time.Second
	maxVisibility      = 12 * time.Hour
	// NoSQSWait makes each receive return at once (short polling).
	NoWait = -1
)

// WithDefaults returns s with its zero fields set.
func (s Config) WithDefaults() Config {
	if s.Wait == 0 {
		s.Wait = DefaultWait
	}
	if s.Visibility == 0 {
		s.Visibility = DefaultVisibility
	}
	if s.MaxMessages == 0 {
		s.MaxMessages = DefaultMaxMessages
	}
	return s
}

// Validate says what is wrong with s, naming the flag to fix.
func (s Config) Validate() error {
	var errs []error
	if s.QueueURL == "" {
		errs = append(errs, errors.New("sqs-queue-url: required with --source sqs: the queue's URL, e.g. https://awssqs.eu-west-1.amazonaws.com/123456789012/job-events.fifo"))
	} else if u, err := url.Parse(s.QueueURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("sqs-queue-url %q: not an http or https URL, e.g. https://awssqs.eu-west-1.amazonaws.com/123456789012/job-events.fifo", s.QueueURL))
	}
	if s.Endpoint != "" {
		if u, err := url.Parse(s.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("sqs-endpoint %q: not an http or https URL, e.g. http://127.0.0.1:4566", s.Endpoint))
		}
	}
	if s.Wait != NoWait && (s.Wait < 0 || s.Wait > maxWait || s.Wait%time.Second != 0) {
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
	u, err := url.Parse(s.QueueURL)
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

// queueURLRegion finds the region in an AWS queue URL
// (https://awssqs.REGION.amazonaws.com/...).
var queueURLRegion = regexp.MustCompile(`^sqs[.-]([a-z0-9-]+)\.amazonaws\.com`)

// sqsClient is one queue's client: receive, delete, keep invisible, and
// the approximate counts that are its lag.
type Client struct {
	cfg    Config
	client *awssqs.Client
	// transport is the client's own, so close can drop its connections.
	transport *http.Transport
}

func (c *Client) Close() { c.transport.CloseIdleConnections() }

// client builds the SDK client with the standard credential chain (or
// s.Credentials), s.Region or the chain's, and s.Endpoint.
func (s Config) Connect(ctx context.Context) (*Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if s.Region != "" {
		opts = append(opts, awsconfig.WithRegion(s.Region))
	}
	if s.Credentials != nil {
		opts = append(opts, awsconfig.WithCredentialsProvider(s.Credentials))
	}
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("projection: sqs: aws configuration: %w", err)
	}
	// The client's transport is its own, built as the chain configured it
	// (AWS_CA_BUNDLE), so that close can drop its connections.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if bc, ok := ac.HTTPClient.(*awshttp.BuildableClient); ok {
		tr = bc.GetTransport()
	}
	ac.HTTPClient = &http.Client{Transport: tr}
	if ac.Region == "" {
		if u, err := url.Parse(s.QueueURL); err == nil {
			if m := queueURLRegion.FindStringSubmatch(u.Host); m != nil {
				ac.Region = m[1]
			}
		}
	}
	if ac.Region == "" {
		return nil, errors.New("sqs-region: no region: set --sqs-region or AWS_REGION (the queue URL names none)")
	}
	c := awssqs.NewFromConfig(ac, func(o *awssqs.Options) {
		if s.Endpoint != "" {
			o.BaseEndpoint = aws.String(s.Endpoint)
		}
	})
	return &Client{cfg: s, client: c, transport: tr}, nil
}

// sqsMessage is one received message.
type Message struct {
	ID      string
	Receipt string
	Body    []byte
	// Group is its MessageGroupId; Sequence its FIFO sequence number
	// (empty on a standard queue).
	Group, Sequence string
	// Sent is when SQS accepted it; Receives how often it was received,
	// this time included.
	Sent     time.Time
	Receives int
}

// Offset is the message's coordinate where the store keeps an offset: the
// sequence number modulo 2^63 (sequence numbers are 128-bit), or, on a
// queue without them, 63 bits of a hash of the message id. It is unique
// per message in practice; the exact message id and sequence number are
// kept beside it.
func (m Message) Offset() int64 {
	if n, ok := new(bigmath.Int).SetString(m.Sequence, 10); ok && n.Sign() >= 0 {
		return new(bigmath.Int).Mod(n, new(bigmath.Int).Lsh(bigmath.NewInt(1), 63)).Int64()
	}
	h := fnv.New64a()
	h.Write([]byte(m.ID))
	return int64(h.Sum64() >> 1)
}

// The SDK's HTTP client has no timeout of its own: a request on a
// connection that died without closing (a blackhole: a NAT or load
// balancer that forgot it, a peer gone) waits for ever. Every request is
// bounded. SQS answers a receive by the end of its long poll, so one still
// open ReceiveSlack after it is given up, and counted as a failed receive;
// a delete or a visibility change is bounded at sqsCallTimeout a request.
const (
	ReceiveSlack   = 10 * time.Second
	sqsCallTimeout = 10 * time.Second
)

// receive long-polls for up to MaxMessages messages, each hidden from other
// consumers for the visibility timeout. It gives up ReceiveSlack after the
// long poll.
func (c *Client) receive(ctx context.Context) ([]Message, error) {
	wait := int32(c.cfg.Wait / time.Second)
	if c.cfg.Wait == NoWait {
		wait = 0
	}
	bound := time.Duration(wait)*time.Second + ReceiveSlack
	rctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	out, err := c.client.ReceiveMessage(rctx, &awssqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(c.cfg.QueueURL),
		MaxNumberOfMessages:         int32(c.cfg.MaxMessages),
		WaitTimeSeconds:             wait,
		VisibilityTimeout:           int32(c.cfg.Visibility / time.Second),
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	})
	if err != nil {
		if ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("receive from %s: no answer within %s (the long poll and %s): %w", c.cfg.QueueURL, bound, ReceiveSlack, err)
		}
		return nil, fmt.Errorf("receive from %s: %w", c.cfg.QueueURL, err)
	}
	msgs := make([]Message, 0, len(out.Messages))
	for _, m := range out.Messages {
		sm := Message{
			ID: aws.ToString(m.MessageId), Receipt: aws.ToString(m.ReceiptHandle), Body: []byte(aws.ToString(m.Body)),
			Group:    m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
			Sequence: m.Attributes[string(types.MessageSystemAttributeNameSequenceNumber)],
		}
		if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
			sm.Sent = time.UnixMilli(ms)
		}
		sm.Receives, _ = strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
		msgs = append(msgs, sm)
	}
	return msgs, nil
}

// SQSAuthError means SQS refused the projector's credentials, or their
// permission on the queue: retrying cannot fix that, so the engine stops
// (`projector run` exits 1) rather than wait as for an outage, as it does
// when Kafka brokers refuse it ([AuthError]).
type AuthError struct {
	// Code is SQS's error code, e.g. InvalidClientTokenId.
	Code string
	Err  error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("sqs: credentials refused (%s): fix the AWS credentials (environment, shared files, role) or their permissions on the queue: %v", e.Code, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }

// sqsAuthCodes are the error codes with which AWS refuses a request's
// credentials, signature or permission.
var sqsAuthCodes = map[string]bool{
	"InvalidClientTokenId": true, "UnrecognizedClientException": true,
	"AccessDenied": true, "AccessDeniedException": true,
	"SignatureDoesNotMatch": true, "InvalidSignatureException": true,
	"MissingAuthenticationToken": true, "MissingAuthenticationTokenException": true,
	"IncompleteSignature": true, "IncompleteSignatureException": true,
	"InvalidAccessKeyId": true,
}

// sqsAuthError returns err as an *SQSAuthError when SQS refused the
// credentials or their permission; otherwise nil.
func AsAuthError(err error) *AuthError {
	var ae *AuthError
	if errors.As(err, &ae) {
		return ae
	}
	var api smithy.APIError
	if errors.As(err, &api) && sqsAuthCodes[api.ErrorCode()] {
		return &AuthError{Code: api.ErrorCode(), Err: err}
	}
	return nil
}

// batchFailure is the messages one batch call did not handle, by id, with
// SQS's reason.
type batchFailure map[string]string

// deleteMessages deletes msgs, ten per request. A message that could not
// be deleted (its receipt handle expired, another consumer received it
// since) is delivered again, which is safe: it is returned in failed.
func (c *Client) deleteMessages(ctx context.Context, msgs []Message) (failed batchFailure, err error) {
	failed = batchFailure{}
	for i := 0; i < len(msgs); i += 10 {
		chunk := msgs[i:min(i+10, len(msgs))]
		entries := make([]types.DeleteMessageBatchRequestEntry, len(chunk))
		for j, m := range chunk {
			entries[j] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i + j)), ReceiptHandle: aws.String(m.Receipt)}
		}
		cctx, cancel := context.WithTimeout(ctx, sqsCallTimeout)
		out, err := c.client.DeleteMessageBatch(cctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(c.cfg.QueueURL), Entries: entries})
		cancel()
		if err != nil {
			for _, m := range msgs[i:] {
				failed[m.ID] = err.Error()
			}
			return failed, fmt.Errorf("delete from %s: %w", c.cfg.QueueURL, err)
		}
		for _, f := range out.Failed {
			k, _ := strconv.Atoi(aws.ToString(f.Id))
			if k >= 0 && k < len(msgs) {
				failed[msgs[k].ID] = aws.ToString(f.Code) + ": " + aws.ToString(f.Message)
			}
		}
	}
	return failed, nil
}

// changeVisibility hides msgs for visibility from now (0 makes them
// visible at once), ten per request.
func (c *Client) changeVisibility(ctx context.Context, msgs []Message, visibility time.Duration) (failed batchFailure, err error) {
	failed = batchFailure{}
	secs := int32(visibility / time.Second)
	for i := 0; i < len(msgs); i += 10 {
		chunk := msgs[i:min(i+10, len(msgs))]
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
		for j, m := range chunk {
			entries[j] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i + j)), ReceiptHandle: aws.String(m.Receipt), VisibilityTimeout: secs}
		}
		cctx, cancel := context.WithTimeout(ctx, sqsCallTimeout)
		out, err := c.client.ChangeMessageVisibilityBatch(cctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(c.cfg.QueueURL), Entries: entries})
		cancel()
		if err != nil {
			return failed, fmt.Errorf("extend visibility in %s: %w", c.cfg.QueueURL, err)
		}
		for _, f := range out.Failed {
			k, _ := strconv.Atoi(aws.ToString(f.Id))
			if k >= 0 && k < len(msgs) {
				failed[msgs[k].ID] = aws.ToString(f.Code) + ": " + aws.ToString(f.Message)
			}
		}
	}
	return failed, nil
}

// SQSCounts are a queue's approximate message counts: visible (waiting to
// be received) and in flight (received, not yet deleted). Their sum is the
// SQS source's lag.
type Counts struct {
	Visible  int64 `json:"visible"`
	InFlight int64 `json:"in_flight"`
}

// counts asks the queue for its approximate counts.
func (c *Client) Counts(ctx context.Context) (Counts, error) {
	out, err := c.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(c.cfg.QueueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible},
	})
	if err != nil {
		return Counts{}, fmt.Errorf("attributes of %s: %w", c.cfg.QueueURL, err)
	}
	var n Counts
	n.Visible, _ = strconv.ParseInt(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)], 10, 64)
	n.InFlight, _ = strconv.ParseInt(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)], 10, 64)
	return n, nil
}

// QueueCounts asks the queue of s for its approximate counts, for `projector
// status`.
func QueueCounts(ctx context.Context, s Config) (Counts, error) {
	c, err := s.WithDefaults().Connect(ctx)
	if err != nil {
		return Counts{}, err
	}
	defer c.Close()
	return c.Counts(ctx)
}
