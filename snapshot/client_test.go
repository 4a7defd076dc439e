package snapshot_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/projector/projector/event"
	"github.com/projector/projector/snapshot"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wait bounds every wait on a signal, so a broken client fails the test
// instead of hanging it.
const wait = 5 * time.Second

// snapshotValue is a valid snapshot record value of jobID.
func snapshotValue(jobID string, version int64) []byte {
	b, err := json.Marshal(map[string]any{
		"job_id":  jobID,
		"version": version,
		"kind":    "snapshot",
		"state":   map[string]any{"status": "running", "processed_articles": 12},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// serve starts an authority that answers with h and counts requests.
func serve(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &requests
}

// client is a client of srv with retries fast enough for tests.
func client(t *testing.T, srv *httptest.Server) *snapshot.Client {
	t.Helper()
	c, err := snapshot.NewClient(srv.URL)
	require.NoError(t, err)
	c.HTTP = srv.Client()
	c.Timeout = 2 * time.Second
	c.InitialInterval = time.Millisecond
	c.MaxInterval = 5 * time.Millisecond
	c.MaxElapsedTime = 2 * time.Second
	return c
}

// fetchAsync runs Fetch in a goroutine and hands back its error.
func fetchAsync(ctx context.Context, c *snapshot.Client, jobID string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Fetch(ctx, jobID)
		done <- err
	}()
	return done
}

// signal notes that something happened without ever blocking a handler.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("no %s within %s", what, wait)
		panic("unreachable")
	}
}

func TestNewClient(t *testing.T) {
	t.Parallel()

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		c, err := snapshot.NewClient("http://authority:8080/")
		require.NoError(t, err)
		require.Equal(t, "http://authority:8080", c.BaseURL)
		require.NotNil(t, c.HTTP)
		require.Zero(t, c.HTTP.Timeout, "the per-request Timeout bounds requests, not the http.Client")
		require.Equal(t, 5*time.Second, c.Timeout)
		require.Equal(t, 4, c.MaxConcurrent)
		require.Equal(t, 200*time.Millisecond, c.InitialInterval)
		require.Equal(t, 5*time.Second, c.MaxInterval)
		require.Equal(t, 30*time.Second, c.MaxElapsedTime)
	})

	for _, ok := range []string{"http://authority:8080", "https://authority.example/api/", "http://127.0.0.1:9000/snap", "http://user:secret@authority"} {
		t.Run("accepts "+ok, func(t *testing.T) {
			t.Parallel()
			_, err := snapshot.NewClient(ok)
			require.NoError(t, err)
		})
	}

	tests := []struct {
		url  string
		want string
	}{
		{url: "", want: "empty"},
		{url: "authority:8080", want: "must start with http:// or https://"},
		{url: "/jobs", want: "must start with http:// or https://"},
		{url: "ftp://authority", want: "must start with http:// or https://"},
		{url: "http://", want: "has no host"},
		{url: "http:///jobs", want: "has no host"},
		{url: "http://user:secret@", want: "has no host"},
		{url: "http://user:secret@authority?x=1", want: "has a query"},
		{url: "http://user:secret@author ity", want: "does not parse"},
		{url: "http://authority?x=1", want: "has a query"},
		{url: "http://authority#top", want: "has a fragment"},
		{url: "http://author ity", want: "does not parse"},
	}
	for _, tt := range tests {
		t.Run("refuses "+tt.url, func(t *testing.T) {
			t.Parallel()
			c, err := snapshot.NewClient(tt.url)
			require.Nil(t, c)
			require.ErrorContains(t, err, tt.want)
			require.NotContains(t, err.Error(), "secret", "the error must not echo a password")
		})
	}
}

func TestFetch(t *testing.T) {
	t.Parallel()

	srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/jobs/job-1" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		_, _ = w.Write(snapshotValue("job-1", 42))
	})
	ev, err := client(t, srv).Fetch(context.Background(), "job-1")
	require.NoError(t, err)
	require.Equal(t, "job-1", ev.JobID)
	require.Equal(t, int64(42), ev.Version)
	require.Equal(t, event.Snapshot, ev.Kind)
	require.JSONEq(t, `{"status":"running","processed_articles":12}`, string(ev.State))
	require.EqualValues(t, 1, requests.Load())
}

func TestFetchEscapesJobID(t *testing.T) {
	t.Parallel()

	tests := []struct {
		base  string // appended to the server's URL
		jobID string
		uri   string // as the authority must see it
	}{
		{jobID: "tenant/a job 1", uri: "/jobs/tenant%2Fa%20job%201"},
		{jobID: "a?b#c%d", uri: "/jobs/a%3Fb%23c%25d"},
		{jobID: "a:b@c!d$e&f'g(h)i*j+k,l;m=n", uri: "/jobs/a%3Ab%40c%21d%24e%26f%27g%28h%29i%2Aj%2Bk%2Cl%3Bm%3Dn"},
		{jobID: "..", uri: "/jobs/%2E%2E"},
		{jobID: "a/../b", uri: "/jobs/a%2F..%2Fb"},
		{jobID: "v1.2_x-y~z", uri: "/jobs/v1.2_x-y~z"},
		{jobID: "job-ü", uri: "/jobs/job-%C3%BC"},
		{base: "/api/", jobID: "x/y", uri: "/api/jobs/x%2Fy"},
	}
	for _, tt := range tests {
		t.Run(tt.jobID, func(t *testing.T) {
			t.Parallel()
			seen := make(chan string, 1)
			srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
				seen <- r.RequestURI
				_, _ = w.Write(snapshotValue(tt.jobID, 1))
			})
			c := client(t, srv)
			c.BaseURL = srv.URL + tt.base
			ev, err := c.Fetch(context.Background(), tt.jobID)
			require.NoError(t, err)
			require.Equal(t, tt.jobID, ev.JobID)
			require.Equal(t, tt.uri, <-seen)
		})
	}
}

// The authority says a job was deleted with a delete record or with 410
// Gone and the delete's version; both come back as a delete event.
func TestFetchDeleted(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		status int
		body   string
	}{
		{name: "200 with a delete", status: http.StatusOK, body: `{"job_id":"job-1","version":9,"kind":"delete","event_id":"auth-9"}`},
		{name: "410 with a version", status: http.StatusGone, body: `{"version":9,"event_id":"auth-9"}`},
		{name: "410 with a version alone", status: http.StatusGone, body: " {\n \"version\" : 9, \"event_id\":\"auth-9\" } "},
		{name: "410 with a delete record", status: http.StatusGone, body: `{"job_id":"job-1","version":9,"kind":"delete","event_id":"auth-9"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			})
			ev, err := client(t, srv).Fetch(context.Background(), "job-1")
			require.NoError(t, err)
			require.Equal(t, event.Event{JobID: "job-1", Version: 9, Kind: event.Delete, EventID: "auth-9"}, ev)
			require.EqualValues(t, 1, requests.Load())
		})
	}
}

// A 410 that does not say at which version the job went is not an answer
// the projector can order, and asking again would get the same one.
func TestFetchGoneWithoutVersionIsNotRetried(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name, body, want string
	}{
		{name: "empty body", body: "", want: "410 Gone without a valid version"},
		{name: "text body", body: "gone", want: "410 Gone without a valid version"},
		{name: "no version", body: `{"reason":"purged"}`, want: "version: required"},
		{name: "an empty object", body: ` { } `, want: "version: required"},
		{name: "version as a string", body: `{"version":"9"}`, want: "version: must be a JSON integer"},
		{name: "other job", body: `{"job_id":"job-2","version":9}`, want: `job_id is "job-2", want "job-1"`},
		{name: "a snapshot", body: `{"job_id":"job-1","version":9,"kind":"snapshot","state":{}}`, want: `kind is "snapshot"`},
		// Which of two versions would count is not the projector's to guess.
		{name: "version twice", body: `{"version":9,"version":12}`, want: `repeats the member name "version"`},
		{name: "job_id twice", body: `{"job_id":"job-2","job_id":"job-1","version":9}`, want: `repeats the member name "job_id"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusGone)
				_, _ = w.Write([]byte(tt.body))
			})
			_, err := client(t, srv).Fetch(context.Background(), "job-1")
			require.ErrorContains(t, err, `snapshot: fetch "job-1"`)
			require.ErrorContains(t, err, tt.want)
			require.EqualValues(t, 1, requests.Load(), "the same request would get the same answer")
		})
	}
}

// Ids that look like paths reach an authority behind Go's ServeMux, which
// cleans dot segments and redirects, as the very id the job has: the
// pattern's {id} is the job id, and the answer is that job's snapshot.
func TestFetchReachesServeMuxWithPathLikeIDs(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	var mu sync.Mutex
	seen := map[string]int{}
	mux.HandleFunc("GET /jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		mu.Lock()
		seen[id]++
		mu.Unlock()
		_, _ = w.Write(snapshotValue(id, 1))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := snapshot.NewClient(srv.URL)
	require.NoError(t, err)
	c.HTTP = srv.Client()
	c.MaxElapsedTime = time.Second

	ids := []string{".", "..", "...", "a/../b", "a/b", "a/./b", "//", "./a", "a/..", "../..", "%2E%2E", "a%2Fb", " ", "?", "#"}
	for _, id := range ids {
		ev, err := c.Fetch(context.Background(), id)
		require.NoError(t, err, "job id %q", id)
		require.Equal(t, id, ev.JobID)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Equal(t, 1, seen[id], "the authority saw job id %q once: %v", id, seen)
	}
	require.Len(t, seen, len(ids), "the authority saw only the ids asked for: %v", seen)
}

func TestFetchNotFound(t *testing.T) {
	t.Parallel()

	srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
		http.NotFound(w, r)
	})
	_, err := client(t, srv).Fetch(context.Background(), "job-1")
	require.ErrorIs(t, err, snapshot.ErrNotFound)
	require.ErrorContains(t, err, `"job-1"`)
	require.EqualValues(t, 1, requests.Load(), "a 404 is an answer, not a failure: it must not be retried")
}

func TestFetchRetriesServerErrors(t *testing.T) {
	t.Parallel()

	var calls atomic.Int32
	srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			http.Error(w, "try later", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(snapshotValue("job-1", 7))
	})
	ev, err := client(t, srv).Fetch(context.Background(), "job-1")
	require.NoError(t, err)
	require.Equal(t, int64(7), ev.Version)
	require.EqualValues(t, 3, requests.Load())
}

// A request cut by the timeout its caller gave it ends the fetch: asked
// again with the same time it would be cut again, and the caller grows
// it. The error says how long it ran, and a request given more time gets
// the answer. A caller that gives no time of its own (verify) has a cut
// request retried within the fetch, as before.
func TestFetchTimeoutEndsTheFetch(t *testing.T) {
	t.Parallel()

	const answerAfter = 200 * time.Millisecond
	// job-2's requests are counted apart: a request of an earlier fetch
	// that the client gave up may reach the server late on a loaded
	// machine.
	var job2 atomic.Int32
	srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/job-2") {
			job2.Add(1)
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(answerAfter):
		}
		_, _ = w.Write(snapshotValue("job-1", 7))
	})
	c := client(t, srv)
	c.Timeout = time.Minute
	_, err := c.Fetch(snapshot.WithRequestTimeout(context.Background(), 50*time.Millisecond), "job-1")
	var te *snapshot.TimeoutError
	require.ErrorAs(t, err, &te)
	require.Equal(t, 50*time.Millisecond, te.Timeout)
	require.ErrorIs(t, err, snapshot.ErrSlow, "a timeout finds the job slow")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, `snapshot: fetch "job-1": no answer within 50ms`)
	require.NotContains(t, err.Error(), "gave up", "a timeout is not retried within the fetch")
	require.EqualValues(t, 1, requests.Load())

	ev, err := c.Fetch(snapshot.WithRequestTimeout(context.Background(), 4*answerAfter), "job-1")
	require.NoError(t, err)
	require.Equal(t, int64(7), ev.Version)
	require.EqualValues(t, 2, requests.Load())

	// Without a time of its own, the client's timeout cuts and the fetch
	// asks again until its budget ends.
	c.Timeout, c.MaxElapsedTime = 50*time.Millisecond, 300*time.Millisecond
	before := requests.Load()
	_, err = c.Fetch(context.Background(), "job-1")
	require.ErrorAs(t, err, &te)
	require.Greater(t, int64(requests.Load()-before), int64(1), "retried within the fetch")

	// The request's own timeout cuts too, however long the client's is.
	c.Timeout = time.Minute
	_, err = c.Fetch(snapshot.WithRequestTimeout(context.Background(), 60*time.Millisecond), "job-2")
	require.ErrorAs(t, err, &te)
	require.Equal(t, 60*time.Millisecond, te.Timeout)
	require.EqualValues(t, 1, job2.Load())
}

func TestFetchGivesUp(t *testing.T) {
	t.Parallel()

	srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "authority overloaded", http.StatusServiceUnavailable)
	})
	c := client(t, srv)
	c.MaxElapsedTime = 50 * time.Millisecond
	start := time.Now()
	_, err := c.Fetch(context.Background(), "job-1")
	require.Error(t, err)
	require.NotErrorIs(t, err, snapshot.ErrNotFound)
	require.ErrorContains(t, err, `snapshot: fetch "job-1"`)
	require.ErrorContains(t, err, "503")
	require.ErrorContains(t, err, "authority overloaded")
	require.Greater(t, requests.Load(), int32(1))
	require.Less(t, time.Since(start), time.Second, "MaxElapsedTime must bound the retries")
}

func TestFetchBadAnswerIsNotRetried(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		body string
		want string
	}{
		{name: "other job", body: string(snapshotValue("job-2", 3)), want: `job_id is "job-2", want "job-1"`},
		{name: "delta", body: `{"job_id":"job-1","version":3,"kind":"delta","ops":[{"op":"set","path":"/a","value":1}]}`, want: `kind is "delta"`},
		{name: "malformed", body: `{"job_id":"job-1","version":`, want: "malformed JSON"},
		{name: "empty", body: "", want: "empty"},
		{name: "no state", body: `{"job_id":"job-1","version":3,"kind":"snapshot"}`, want: "state: required"},
		{name: "version twice", body: `{"job_id":"job-1","version":3,"kind":"snapshot","state":{},"version":30}`, want: `repeats the member name "version"`},
		{name: "job_id twice", body: `{"job_id":"job-2","job_id":"job-1","version":3,"kind":"snapshot","state":{}}`, want: `repeats the member name "job_id"`},
		{name: "a name twice in the state", body: `{"job_id":"job-1","version":3,"kind":"snapshot","state":{"status":"running","status":"failed"}}`, want: `state: repeats the member name "status"`},
		{name: "oversized", body: `{"job_id":"job-1","pad":"` + strings.Repeat("x", event.MaxValueBytes) + `"}`, want: "over the 1 MiB limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write([]byte(tt.body))
			})
			_, err := client(t, srv).Fetch(context.Background(), "job-1")
			require.ErrorContains(t, err, `snapshot: fetch "job-1"`)
			require.ErrorContains(t, err, "bad snapshot")
			require.ErrorContains(t, err, tt.want)
			require.NotErrorIs(t, err, snapshot.ErrNotFound)
			require.EqualValues(t, 1, requests.Load(), "the same request would get the same answer")
		})
	}
}

func TestFetchMaxConcurrent(t *testing.T) {
	t.Parallel()

	const fetches, limit = 10, 2
	var inFlight, maxInFlight atomic.Int32
	arrived := make(chan struct{})
	release := make(chan struct{})
	stop := make(chan struct{})
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
		}
		select {
		case arrived <- struct{}{}:
		case <-stop:
			return
		}
		select {
		case <-release:
		case <-stop:
			return
		}
		// Leave before answering: the client frees its slot only after
		// the answer, so this count never runs ahead of the client's.
		inFlight.Add(-1)
		_, _ = w.Write(snapshotValue(strings.TrimPrefix(r.URL.Path, "/jobs/"), 1))
	})
	// Registered after serve, so it runs before srv.Close waits on handlers.
	t.Cleanup(func() { close(stop) })

	c := client(t, srv)
	c.MaxConcurrent = limit
	c.Timeout = 10 * time.Second
	results := make([]<-chan error, fetches)
	for i := range fetches {
		results[i] = fetchAsync(context.Background(), c, fmt.Sprintf("job-%d", i))
	}

	// Fill both slots, then let one request out for each one let in.
	for range limit {
		receive(t, arrived, "request")
	}
	for range fetches - limit {
		select {
		case release <- struct{}{}:
		case <-time.After(wait):
			t.Fatal("no request to release")
		}
		receive(t, arrived, "request")
		require.LessOrEqual(t, maxInFlight.Load(), int32(limit))
	}
	for range limit {
		release <- struct{}{}
	}
	for i, done := range results {
		require.NoError(t, receive(t, done, fmt.Sprintf("result of fetch %d", i)))
	}
	require.EqualValues(t, limit, maxInFlight.Load())
}

func TestFetchCancel(t *testing.T) {
	t.Parallel()

	t.Run("during a request", func(t *testing.T) {
		t.Parallel()
		arrived := make(chan struct{}, 1)
		srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
			signal(arrived)
			<-r.Context().Done()
		})
		c := client(t, srv)
		c.Timeout = time.Minute
		c.MaxElapsedTime = time.Minute
		ctx, cancel := context.WithCancel(context.Background())
		done := fetchAsync(ctx, c, "job-1")
		receive(t, arrived, "request")
		cancel()
		start := time.Now()
		err := receive(t, done, "result")
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), time.Second)
		require.EqualValues(t, 1, requests.Load())
	})

	t.Run("during the backoff", func(t *testing.T) {
		t.Parallel()
		arrived := make(chan struct{}, 1)
		srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "down", http.StatusBadGateway)
			signal(arrived)
		})
		c := client(t, srv)
		c.InitialInterval = time.Minute
		c.MaxInterval = time.Minute
		c.MaxElapsedTime = time.Hour
		ctx, cancel := context.WithCancel(context.Background())
		done := fetchAsync(ctx, c, "job-1")
		receive(t, arrived, "request")
		cancel()
		start := time.Now()
		err := receive(t, done, "result")
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), time.Second)
		require.EqualValues(t, 1, requests.Load())
	})

	t.Run("before the first request", func(t *testing.T) {
		t.Parallel()
		srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write(snapshotValue("job-1", 1))
		})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := client(t, srv).Fetch(ctx, "job-1")
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, requests.Load())
	})
}

func TestFetchRefusesBadInput(t *testing.T) {
	t.Parallel()

	srv, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(snapshotValue("job-1", 1))
	})

	_, err := client(t, srv).Fetch(context.Background(), "")
	require.ErrorContains(t, err, "empty job id")

	// A Client built by hand gets the same URL check as NewClient, and
	// fails at once instead of retrying a request that can never work.
	c := &snapshot.Client{BaseURL: "authority:8080"}
	_, err = c.Fetch(context.Background(), "job-1")
	require.ErrorContains(t, err, "must start with http:// or https://")

	require.Zero(t, requests.Load())
}

func TestFetchZeroClientUsesDefaults(t *testing.T) {
	t.Parallel()

	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(snapshotValue("job-1", 3))
	})
	c := &snapshot.Client{BaseURL: srv.URL, HTTP: srv.Client()}
	ev, err := c.Fetch(context.Background(), "job-1")
	require.NoError(t, err)
	require.Equal(t, int64(3), ev.Version)
}
