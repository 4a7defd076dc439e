package projection

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// refusingSQS is an SQS endpoint that refuses every request as AWS refuses
// credentials it does not know: with the JSON protocol's error type and,
// where given, the query-compatible code in x-amzn-query-error.
func refusingSQS(t *testing.T, status int, queryError, jsonType string) (url string, requests *atomic.Int64) {
	requests = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if queryError != "" {
			w.Header().Set("x-amzn-query-error", queryError)
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"__type":"` + jsonType + `","message":"refused by the test"}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, requests
}

// TestSQSRefusedCredentialsStopRun: SQS refusing the credentials (an
// unknown key, a bad signature, no permission on the queue) stops Run
// with an *SQSAuthError at once, as Kafka brokers refusing them do,
// instead of retrying forever as an outage; a server error is an outage.
func TestSQSRefusedCredentialsStopRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                       string
		status                     int
		queryError, jsonType, code string
	}{
		{"unknown key", 403, "InvalidClientTokenId;Sender", "com.amazon.coral.service#UnrecognizedClientException", "InvalidClientTokenId"},
		{"unknown key without query code", 400, "", "com.amazon.coral.service#UnrecognizedClientException", "UnrecognizedClientException"},
		{"bad signature", 403, "SignatureDoesNotMatch;Sender", "com.amazon.coral.service#InvalidSignatureException", "SignatureDoesNotMatch"},
		{"no permission", 400, "AccessDenied;Sender", "com.amazon.coral.service#AccessDeniedException", "AccessDenied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url, _ := refusingSQS(t, tc.status, tc.queryError, tc.jsonType)
			q := SQS{QueueURL: url + "/000000000000/jobs.fifo", Endpoint: url, Region: "us-east-1", ShortPoll: true,
				Credentials: &sqscfg.Credentials{AccessKeyID: "AKIDWRONG", SecretAccessKey: "wrong"}}.WithDefaults()
			p, err := New(Config{Source: SourceSQS, SQS: q, Store: pgtest.Store(t), Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			start := time.Now()
			err = p.Run(ctx)
			var ae *SQSAuthError
			require.True(t, errors.As(err, &ae), "Run returned %v", err)
			require.Equal(t, tc.code, ae.Code)
			require.Contains(t, err.Error(), "credentials refused")
			require.Less(t, time.Since(start), 20*time.Second, "stopped at once, not after retries")
		})
	}
	t.Run("server error is an outage", func(t *testing.T) {
		t.Parallel()
		url, requests := refusingSQS(t, 500, "", "com.amazon.coral.service#InternalFailure")
		q := SQS{QueueURL: url + "/000000000000/jobs.fifo", Endpoint: url, Region: "us-east-1", ShortPoll: true,
			Credentials: &sqscfg.Credentials{AccessKeyID: "AKID", SecretAccessKey: "secret"}}.WithDefaults()
		p, err := New(Config{Source: SourceSQS, SQS: q, Store: pgtest.Store(t), Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		require.Eventually(t, func() bool { return requests.Load() >= 5 }, 20*time.Second, 10*time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("Run stopped on a server error: %v", err)
		default:
		}
		cancel()
		require.NoError(t, <-done)
	})
}
