package sqs

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/sqsemu"
	"github.com/projector/projector/internal/testkit/sqstest"
	"github.com/projector/projector/source"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// emulatorSQS is the configuration of a queue on the emulator, with
// short timings for tests.
func emulatorSQS(e *sqsemu.Emulator, queueURL string, visibility time.Duration) Config {
	return Config{
		QueueURL: queueURL, Endpoint: e.Endpoint, Region: sqsemu.Region, Wait: time.Second, Visibility: visibility,
		Credentials: &sqscfg.Credentials{AccessKeyID: sqsemu.AccessKey, SecretAccessKey: sqsemu.SecretKey},
	}.WithDefaults()
}

var sendSeq atomic.Int64

// sendSQS sends each value to queueURL with its group id, and a
// deduplication id of its own, so that a value sent twice arrives twice.
func sendSQS(t testing.TB, e *sqsemu.Emulator, queueURL string, groupValues ...string) {
	t.Helper()
	c := e.Client()
	for i := 0; i+1 < len(groupValues); i += 2 {
		_, err := c.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(queueURL),
			MessageGroupId: aws.String(groupValues[i]), MessageBody: aws.String(groupValues[i+1]),
			MessageDeduplicationId: aws.String(fmt.Sprint(sendSeq.Add(1)))})
		require.NoError(t, err)
	}
}

func TestSQSValidate(t *testing.T) {
	ok := Config{QueueURL: "https://sqs.eu-west-1.amazonaws.com/1/q.fifo"}.WithDefaults()
	require.NoError(t, ok.Validate())
	require.Equal(t, 20*time.Second, ok.Wait)
	require.Equal(t, 60*time.Second, ok.Visibility)
	require.Equal(t, 10, ok.MaxMessages)
	for _, c := range []struct {
		s    Config
		want string
	}{
		{Config{}, "sqs-queue-url: required"},
		{Config{QueueURL: "q.fifo"}, "sqs-queue-url \"q.fifo\": not an http or https URL"},
		{Config{QueueURL: ok.QueueURL, Endpoint: "localhost:4566"}, "sqs-endpoint"},
		{Config{QueueURL: ok.QueueURL, Wait: 21 * time.Second}, "sqs-wait 21s"},
		{Config{QueueURL: ok.QueueURL, Visibility: 1500 * time.Millisecond}, "sqs-visibility 1.5s"},
		{Config{QueueURL: ok.QueueURL, MaxMessages: 11}, "sqs-max-messages 11: SQS returns 1 to 10"},
		{Config{QueueURL: ok.QueueURL, MaxMessages: -1}, "sqs-max-messages -1"},
	} {
		err := c.s.WithDefaults().Validate()
		require.Error(t, err, "%+v", c.s)
		require.Contains(t, err.Error(), c.want)
	}
	require.NoError(t, Config{QueueURL: ok.QueueURL, ShortPoll: true}.WithDefaults().Validate())
	require.Equal(t, "sqs:q.fifo", ok.Name())
}

// TestSQSMessageOffset: the offset kept for a message is its 128-bit
// sequence number modulo 2^63, and without one a hash of its id; both fit
// a bigint and differ between messages.
func TestSQSMessageOffset(t *testing.T) {
	require.Equal(t, int64(42), Message{Sequence: "42"}.Offset())
	// 18849496460467696128 - 2^64
	require.Equal(t, int64(402752386758144512), Message{Sequence: "18849496460467696128"}.Offset())
	a, b := Message{ID: "a"}.Offset(), Message{ID: "b"}.Offset()
	require.GreaterOrEqual(t, a, int64(0))
	require.NotEqual(t, a, b)
}

// TestSQSClient runs the client against the emulator: a receive returns
// the body, group, sequence number and receive count; extend keeps a
// message hidden past its first visibility timeout; delete removes it; the
// counts see visible and in-flight messages.
func TestSQSClient(t *testing.T) {
	e := sqstest.New(t)
	url := sqstest.Queue(t, e, 2*time.Second)
	cfg := emulatorSQS(e, url, 2*time.Second)
	c, err := Connect(t.Context(), cfg)
	require.NoError(t, err)
	defer c.Close()
	sendSQS(t, e, url, "job-1", `{"n":1}`, "job-2", `{"n":2}`, "job-2", `{"n":3}`)

	n, err := c.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, Counts{Visible: 3}, n)

	msgs, err := c.receive(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, msgs)
	for _, m := range msgs {
		require.NotEmpty(t, m.ID)
		require.NotEmpty(t, m.Receipt)
		require.True(t, strings.HasPrefix(m.Group, "job-"), m.Group)
		require.NotEmpty(t, m.Sequence)
		require.Equal(t, 1, m.Receives)
		require.False(t, m.Sent.IsZero())
	}
	n, err = c.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(len(msgs)), n.InFlight)

	// Past the first timeout, extended messages stay hidden.
	for range 3 {
		time.Sleep(700 * time.Millisecond)
		failed, err := c.changeVisibility(t.Context(), msgs, cfg.Visibility)
		require.NoError(t, err)
		require.Empty(t, failed)
	}
	n, err = c.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(len(msgs)), n.InFlight, "extended messages came back")

	failed, err := c.deleteMessages(t.Context(), msgs)
	require.NoError(t, err)
	require.Empty(t, failed)
	// Whatever is left (the emulator hands out one message per group per
	// receive) is received next, never a deleted one.
	deleted := map[string]bool{}
	for _, m := range msgs {
		deleted[m.ID] = true
	}
	left := 3 - len(msgs)
	for got := 0; got < left; {
		more, err := c.receive(t.Context())
		require.NoError(t, err)
		for _, m := range more {
			require.False(t, deleted[m.ID], "deleted message %s came back", m.ID)
			got++
		}
		_, err = c.deleteMessages(t.Context(), more)
		require.NoError(t, err)
	}
	n, err = c.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, Counts{}, n)
}

// TestSQSReader: messages taken from the reader stay invisible past their
// visibility timeout while in flight, are deleted by ack, and a message
// whose group is not its job id is counted.
func TestSQSReader(t *testing.T) {
	e := sqstest.New(t)
	// 3 s, kept every 1 s: a loaded machine does not miss a turn.
	url := sqstest.Queue(t, e, 3*time.Second)
	cfg := emulatorSQS(e, url, 3*time.Second)
	c, err := Connect(t.Context(), cfg)
	require.NoError(t, err)
	defer c.Close()
	r := NewReader(c, slog.New(slog.DiscardHandler), 10)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	sendSQS(t, e, url, "j1", `{"job_id":"j1","version":1,"kind":"snapshot","state":{}}`,
		"other", `{"job_id":"j2","version":1,"kind":"snapshot","state":{}}`)
	var got []Message
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		got = append(got, r.take(ctx, 10, time.Second, 50*time.Millisecond)...)
	}
	require.Len(t, got, 2)
	require.Equal(t, int64(1), r.stats.groupMismatch.Load(), "j2 was sent in group other")

	// Past the visibility timeout, the keeper has kept both hidden.
	time.Sleep(4 * time.Second)
	n, err := c.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, Counts{InFlight: 2}, n)
	require.Empty(t, r.take(ctx, 10, 100*time.Millisecond, time.Millisecond), "a message in flight was delivered again")

	r.ack(t.Context(), []string{got[0].ID, got[1].ID})
	n, err = c.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, Counts{}, n)
	st := r.stats.snapshot()
	require.Equal(t, Counters{Received: 2, GroupNotJobID: 1, Deleted: 2}, st)
}

// TestSQSSourceCloseReleasesInFlight: messages received and never
// acknowledged are made visible again at once when the source closes (the
// engine stops), not only after their visibility timeout; acknowledged
// ones stay deleted.
func TestSQSSourceCloseReleasesInFlight(t *testing.T) {
	e := sqstest.New(t)
	url := sqstest.Queue(t, e, 30*time.Second)
	cfg := emulatorSQS(e, url, 30*time.Second)
	c, err := Connect(t.Context(), cfg)
	require.NoError(t, err)
	defer c.Close()
	src := NewSource(NewReader(c, slog.New(slog.DiscardHandler), 10), 10, 50*time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { src.r.Run(ctx) })

	sendSQS(t, e, url, "a", `{"n":1}`, "b", `{"n":2}`, "c", `{"n":3}`)
	var recs []source.Record
	deadline := time.Now().Add(5 * time.Second)
	for len(recs) < 3 && time.Now().Before(deadline) {
		got, err := src.Fetch(ctx, time.Second)
		require.NoError(t, err)
		recs = append(recs, got...)
	}
	require.Len(t, recs, 3)
	for _, r := range recs {
		require.NotEmpty(t, r.Coord.MessageID)
		require.Equal(t, -1, r.Coord.Partition)
	}
	require.NoError(t, src.Ack(t.Context(), recs[:1]))
	cancel()
	wg.Wait()
	// The receiver's last long poll was open at the stop: it was left to
	// finish, with whatever it took kept in flight for Close to release.
	require.NoError(t, src.Close())
	n, err := c.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, Counts{Visible: 2}, n, "the two unacknowledged messages are visible again at once")
}
