package wait

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Bounds on the timeout an HTTP client asks for.
const (
	// DefaultTimeout is the wait of a request that names no timeout.
	DefaultTimeout = 5 * time.Second
	// MaxTimeout is the longest wait a request may ask for.
	MaxTimeout = 60 * time.Second
)

// Handler serves the long-poll GET /wait on w:
//
//	/wait?job=ID&version=V[&timeout=2s]
//	/wait?partition=P&offset=O[&topic=T][&timeout=2s]
//
// topic defaults to the projection's (empty for a source with no
// positions, SQS: by job only). It answers 200 once reached, 504 when the
// timeout ends first, 400 for bad parameters (the body says why), 503 when
// the instance holds too many waiters, is stopping, or the database did
// not answer the read at the timeout (with "error" saying which). The
// body is the [JobState] or [PositionState] read at the end, with
// "reached".
func Handler(w *Waiter, topic string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /wait", func(rw http.ResponseWriter, r *http.Request) {
		q, err := parseQuery(r, topic)
		if err != nil {
			writeJSON(rw, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), q.timeout)
		defer cancel()
		var body any
		if q.byJob {
			body, err = w.WaitJob(ctx, q.job, q.version)
		} else {
			body, err = w.WaitPosition(ctx, q.topic, q.partition, q.offset)
		}
		switch {
		case err == nil:
			writeJSON(rw, http.StatusOK, body)
		case errors.Is(err, ErrTooManyWaiters):
			rw.Header().Set("Retry-After", "1")
			writeJSON(rw, http.StatusServiceUnavailable, map[string]string{"error": "too many waiters on this instance; try again or another instance"})
		case errors.Is(err, ErrStopped):
			// Answered, not dropped: the client may ask another instance.
			rw.Header().Set("Retry-After", "1")
			writeJSON(rw, http.StatusServiceUnavailable, withError(body, "this instance is stopping; ask again, or another instance"))
		case errors.Is(err, ErrUnavailable):
			// Not a timeout: nothing true can be said of the job.
			rw.Header().Set("Retry-After", "1")
			writeJSON(rw, http.StatusServiceUnavailable, withError(body, err.Error()))
		case r.Context().Err() != nil:
			// The client left: no one reads an answer.
		default:
			writeJSON(rw, http.StatusGatewayTimeout, body)
		}
	})
	return mux
}

type query struct {
	byJob     bool
	job       string
	version   int64
	topic     string
	partition int
	offset    int64
	timeout   time.Duration
}

// maxJobIDBytes bounds a waited-for job id, and so what one waiter holds.
const maxJobIDBytes = 512

func parseQuery(r *http.Request, topic string) (query, error) {
	v := r.URL.Query()
	q := query{timeout: DefaultTimeout, topic: topic}
	if s := v.Get("timeout"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > MaxTimeout {
			return q, fmt.Errorf("timeout %q: want a duration above 0 and at most %s, e.g. timeout=2s", s, MaxTimeout)
		}
		q.timeout = d
	}
	job, part := v.Has("job") || v.Has("version"), v.Has("partition") || v.Has("offset") || v.Has("topic")
	switch {
	case job && part:
		return q, errors.New("ask by job and version, or by partition and offset, not both")
	case job:
		q.byJob, q.job = true, v.Get("job")
		if q.job == "" {
			return q, errors.New("job: missing; e.g. job=job-42&version=7")
		}
		if len(q.job) > maxJobIDBytes {
			return q, fmt.Errorf("job: %d bytes; a job id is at most %d", len(q.job), maxJobIDBytes)
		}
		n, err := strconv.ParseInt(v.Get("version"), 10, 64)
		if err != nil || n < 1 {
			return q, fmt.Errorf("version %q: want an integer of at least 1", v.Get("version"))
		}
		q.version = n
	case part:
		if v.Has("topic") {
			q.topic = v.Get("topic")
		}
		if q.topic == "" {
			return q, errors.New("this projection stores no positions (SQS): wait by job and version")
		}
		p, err := strconv.Atoi(v.Get("partition"))
		if err != nil || p < 0 {
			return q, fmt.Errorf("partition %q: want an integer of at least 0", v.Get("partition"))
		}
		o, err := strconv.ParseInt(v.Get("offset"), 10, 64)
		if err != nil || o < 0 {
			return q, fmt.Errorf("offset %q: want an integer of at least 0", v.Get("offset"))
		}
		q.partition, q.offset = p, o
	default:
		return q, errors.New("want job and version (job=ID&version=V), or partition and offset (partition=P&offset=O)")
	}
	return q, nil
}

// withError is body's fields with "error": reason beside them.
func withError(body any, reason string) map[string]any {
	out := map[string]any{}
	if b, err := json.Marshal(body); err == nil {
		_ = json.Unmarshal(b, &out)
	}
	out["error"] = reason
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
