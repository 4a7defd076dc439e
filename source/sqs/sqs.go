package sqs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	bigmath "math/big"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// Config is an SQS FIFO queue the projector reads, and how
// ([sqscfg.Config]).
type Config = sqscfg.Config

// AuthError is SQS refusing the credentials ([sqscfg.AuthError]); Counts
// a queue's approximate counts ([sqscfg.Counts]).
type (
	AuthError = sqscfg.AuthError
	Counts    = sqscfg.Counts
)

// SQS defaults and bounds ([sqscfg.DefaultWait], ...).
const (
	DefaultWait        = sqscfg.DefaultWait
	DefaultVisibility  = sqscfg.DefaultVisibility
	DefaultMaxMessages = sqscfg.DefaultMaxMessages
)

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

// Connect builds the SDK client with the standard credential chain (or
// s.Credentials), s.Region or the chain's, and s.Endpoint.
func Connect(ctx context.Context, s Config) (*Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if s.Region != "" {
		opts = append(opts, awsconfig.WithRegion(s.Region))
	}
	if c := s.Credentials; c != nil {
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken)))
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
		if m := queueURLRegion.FindStringSubmatch(s.Host()); m != nil {
			ac.Region = m[1]
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
	wait := int32(c.pollWait() / time.Second)
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
// visible at once), ten per request and up to visibilityCalls requests at
// once (thousands of messages can be in flight at a stop). failed holds
// every message not known to be changed: those SQS refused, and those of a
// request that failed (which SQS may have applied all the same); err is
// the first request's failure.
func (c *Client) changeVisibility(ctx context.Context, msgs []Message, visibility time.Duration) (failed batchFailure, err error) {
	failed = batchFailure{}
	secs := int32(visibility / time.Second)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, visibilityCalls)
	for i := 0; i < len(msgs); i += 10 {
		chunk := msgs[i:min(i+10, len(msgs))]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
			for j, m := range chunk {
				entries[j] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: aws.String(m.Receipt), VisibilityTimeout: secs}
			}
			cctx, cancel := context.WithTimeout(ctx, sqsCallTimeout)
			out, err := c.client.ChangeMessageVisibilityBatch(cctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(c.cfg.QueueURL), Entries: entries})
			cancel()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				for _, m := range chunk {
					failed[m.ID] = err.Error()
				}
				if first == nil {
					first = fmt.Errorf("change the visibility of messages in %s: %w", c.cfg.QueueURL, err)
				}
				return
			}
			for _, f := range out.Failed {
				k, _ := strconv.Atoi(aws.ToString(f.Id))
				if k >= 0 && k < len(chunk) {
					failed[chunk[k].ID] = aws.ToString(f.Code) + ": " + aws.ToString(f.Message)
				}
			}
		})
	}
	wg.Wait()
	return failed, first
}

// visibilityCalls bounds the visibility requests [Client.changeVisibility]
// has in flight at once.
const visibilityCalls = 10

// pollWait is the long poll of one receive: none with ShortPoll.
func (c *Client) pollWait() time.Duration {
	if c.cfg.ShortPoll {
		return 0
	}
	return c.cfg.Wait
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
	c, err := Connect(ctx, s.WithDefaults())
	if err != nil {
		return Counts{}, err
	}
	defer c.Close()
	return c.Counts(ctx)
}
