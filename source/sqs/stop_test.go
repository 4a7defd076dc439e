package sqs

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/source/sqs/sqscfg"
)

// hungReceives is an SQS endpoint that hands out one message, then holds
// every later receive open without answering, as a server that does not
// hand the released messages to an open long poll would; it records the
// releases and when the held receive was cut.
type hungReceives struct {
	mu         sync.Mutex
	receives   int
	heldAt     time.Time
	cutAt      time.Time
	releasedAt time.Time
	held       chan struct{}
	cut        chan struct{}
}

func (h *hungReceives) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	switch r.Header.Get("X-Amz-Target") {
	case "AmazonSQS.ReceiveMessage":
		h.mu.Lock()
		h.receives++
		first := h.receives == 1
		if !first && h.heldAt.IsZero() {
			h.heldAt = time.Now()
			close(h.held)
		}
		h.mu.Unlock()
		if first {
			sum := md5.Sum([]byte("{}"))
			_ = json.NewEncoder(w).Encode(map[string]any{"Messages": []map[string]any{{
				"MessageId": "m1", "ReceiptHandle": "r1", "Body": "{}", "MD5OfBody": hex.EncodeToString(sum[:]),
				"Attributes": map[string]string{"MessageGroupId": "g", "SequenceNumber": "1",
					"SentTimestamp": strconv.FormatInt(time.Now().UnixMilli(), 10)},
			}}})
			return
		}
		<-r.Context().Done()
		h.mu.Lock()
		if h.cutAt.IsZero() {
			h.cutAt = time.Now()
			close(h.cut)
		}
		h.mu.Unlock()
	case "AmazonSQS.ChangeMessageVisibilityBatch":
		var in struct {
			Entries []struct {
				Id                string
				VisibilityTimeout int
			}
		}
		_ = json.Unmarshal(body, &in)
		ok := make([]map[string]string, 0, len(in.Entries))
		h.mu.Lock()
		for _, e := range in.Entries {
			ok = append(ok, map[string]string{"Id": e.Id})
			if e.VisibilityTimeout == 0 && h.releasedAt.IsZero() {
				h.releasedAt = time.Now()
			}
		}
		h.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"Successful": ok, "Failed": []any{}})
	default:
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"com.amazon.coral.service#InvalidAction","message":"not served here"}`))
	}
}

// TestAStopWaitsForTheOpenReceiveOnlyAsLongAsItsLongPoll: at a stop with
// a message in flight, the message is released, and the receive open then
// is left to run to the end of its long poll (cut, it could take the
// released message on the server and hide it), but no longer: a server
// that never answers does not hold the stop for the receive's own bound
// (the long poll and ReceiveSlack).
func TestAStopWaitsForTheOpenReceiveOnlyAsLongAsItsLongPoll(t *testing.T) {
	h := &hungReceives{held: make(chan struct{}), cut: make(chan struct{})}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	const wait = time.Second
	c, err := Connect(t.Context(), Config{
		QueueURL: srv.URL + "/000000000000/jobs.fifo", Endpoint: srv.URL, Region: "us-east-1", Wait: wait, Visibility: time.Minute,
		Credentials: &sqscfg.Credentials{AccessKeyID: "AKID", SecretAccessKey: "secret"},
	}.WithDefaults())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	r := NewReader(c, slog.New(slog.NewTextHandler(io.Discard, nil)), 10)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		r.Run(ctx)
	}()
	recs, err := NewSource(r, 10, 0).Fetch(t.Context(), 10*time.Second)
	require.NoError(t, err)
	require.Len(t, recs, 1, "the one message handed out")
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no second receive was opened")
	}

	stopped := time.Now()
	cancel()
	select {
	case <-ran:
	case <-time.After(ReceiveSlack + wait):
		t.Fatalf("the receiver did not stop within the receive's own bound (%s)", ReceiveSlack+wait)
	}
	took := time.Since(stopped)
	select { // the server sees the cut a moment after the client makes it
	case <-h.cut:
	case <-time.After(5 * time.Second):
		t.Fatal("the held receive was never cut")
	}
	h.mu.Lock()
	heldAt, cutAt, releasedAt := h.heldAt, h.cutAt, h.releasedAt
	h.mu.Unlock()
	require.False(t, releasedAt.IsZero(), "the message in flight was released at the stop")
	require.GreaterOrEqual(t, cutAt.Sub(heldAt), wait, "the receive open at the stop was left to the end of its long poll")
	require.Less(t, cutAt.Sub(heldAt), wait+releaseMargin+3*time.Second, "and cut soon after it")
	require.Less(t, took, wait+releaseMargin+3*time.Second, "the stop took %s", took)
	t.Logf("stop took %s; the held receive was cut %s after it opened", took, cutAt.Sub(heldAt))
}
