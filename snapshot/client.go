package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/projector/projector/event"
)

// ErrNotFound: the authority answered 404, it does not know the job.
var ErrNotFound = errors.New("the authority does not know this job (404)")

// Defaults of a [Client], used for any field left at zero.
const (
	DefaultTimeout         = 5 * time.Second
	DefaultMaxConcurrent   = 4
	DefaultInitialInterval = 200 * time.Millisecond
	DefaultMaxInterval     = 5 * time.Second
	DefaultMaxElapsedTime  = 30 * time.Second
)

// randomization spreads the retries of many gaps hitting a struggling
// authority at once, so they do not come back in lockstep.
const randomization = 0.5

// Client fetches trusted snapshots from the authority (docs/contract.md, section 3).
// It is safe for concurrent use; it must not be copied after first use.
type Client struct {
	// BaseURL is the authority, e.g. http://authority:8080; requests go to
	// BaseURL + "/jobs/" + [EscapeJobID](jobID).
	BaseURL string
	// HTTP sends the requests. It should have no overall Timeout: each
	// request is bounded by Timeout through its context, which covers
	// reading the body too. Nil means http.DefaultClient.
	HTTP *http.Client
	// Timeout bounds one request, body included, unless the request's
	// context gives its own ([WithRequestTimeout]). A request cut by its
	// timeout ends the fetch with a [*TimeoutError]: asked again with the
	// same time, the answer would be cut again.
	Timeout time.Duration
	// MaxConcurrent bounds the requests in flight at once across all
	// callers, so a burst of gaps cannot swamp the authority. It is read
	// on the first Fetch.
	MaxConcurrent int
	// SlowConcurrent is the slow lane: up to this many requests that run
	// past SlowMedians times the median answer time (at least SlowFloor)
	// stop counting against MaxConcurrent and count here instead, so slow
	// answers do not hold the main slots while prompt ones wait. Such a
	// request is cut when the slow lane is full ([ErrSlowLaneFull]), or
	// once it has run MovedThresholds times the threshold ([ErrSlow]).
	// Requests of jobs known to be slow start here ([InSlowLane]), in up
	// to half of it, and run to their timeout. Zero means no slow lane. It
	// is read on the first Fetch.
	SlowConcurrent int
	// The backoff between attempts: exponential from InitialInterval up to
	// MaxInterval, each wait jittered by ±50%, giving up once
	// MaxElapsedTime has passed since the first attempt.
	InitialInterval, MaxInterval, MaxElapsedTime time.Duration
	// Redirects says which redirects of the authority's answers are
	// followed: [SameOrigin] (the zero value) or [NoRedirects]. A redirect
	// that is not followed ends the fetch: asked again, the authority
	// would send the same one.
	Redirects Redirects

	lanesOnce sync.Once
	ln        *lanes
}

// NewClient returns a client of the authority at baseURL with every
// default filled in.
func NewClient(baseURL string) (*Client, error) {
	base, err := checkBaseURL(baseURL)
	if err != nil {
		return nil, err
	}
	return &Client{
		BaseURL:         base,
		HTTP:            &http.Client{},
		Timeout:         DefaultTimeout,
		MaxConcurrent:   DefaultMaxConcurrent,
		InitialInterval: DefaultInitialInterval,
		MaxInterval:     DefaultMaxInterval,
		MaxElapsedTime:  DefaultMaxElapsedTime,
		Redirects:       SameOrigin,
	}, nil
}

// checkBaseURL returns baseURL without a trailing slash, or an error
// that says what to fix. User info is allowed (the HTTP client sends it as
// basic auth) but never echoed back.
func checkBaseURL(baseURL string) (string, error) {
	const example = "give an absolute http(s) URL such as http://authority:8080"
	if baseURL == "" {
		return "", errors.New("snapshot: the authority URL is empty: " + example)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		// *url.Error repeats the whole URL, password included.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return "", fmt.Errorf("snapshot: the authority URL does not parse (%w): %s", err, example)
	}
	shown := u.Redacted()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("snapshot: the authority URL %q must start with http:// or https://, e.g. http://authority:8080", shown)
	case u.Host == "":
		return "", fmt.Errorf("snapshot: the authority URL %q has no host: %s", shown, example)
	case u.RawQuery != "" || u.ForceQuery:
		return "", fmt.Errorf("snapshot: the authority URL %q has a query: remove it, /jobs/{job_id} is appended to the path", shown)
	case u.Fragment != "":
		return "", fmt.Errorf("snapshot: the authority URL %q has a fragment: remove it, /jobs/{job_id} is appended to the path", shown)
	}
	return strings.TrimRight(baseURL, "/"), nil
}

// Fetch GETs the job's snapshot from the authority. It returns a valid
// snapshot event of jobID, or a delete event when the authority answers
// that the job was deleted (a 200 with a delete record, or 410 Gone with
// the delete's version), ErrNotFound (wrapped) when the authority does not
// know the job, or the last error once MaxElapsedTime has passed. A 200
// or a 410 whose body is not a valid answer about jobID is a permanent
// error: asking again would get the same answer. So is a request cut by
// its timeout ([*TimeoutError]): the caller decides how long the next one
// gets. Cancelling ctx stops it at once, with ctx's error.
func (c *Client) Fetch(ctx context.Context, jobID string) (event.Event, error) {
	if jobID == "" {
		return event.Event{}, errors.New("snapshot: fetch: empty job id")
	}
	base, err := checkBaseURL(c.BaseURL)
	if err != nil {
		return event.Event{}, fmt.Errorf("snapshot: fetch %q: %w", jobID, err)
	}
	target := base + "/jobs/" + EscapeJobID(jobID)

	// A new backoff per call: ExponentialBackOff holds state and is not
	// safe for concurrent use.
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(orDefault(c.InitialInterval, DefaultInitialInterval)),
		backoff.WithMaxInterval(orDefault(c.MaxInterval, DefaultMaxInterval)),
		// Set deliberately: backoff's own default gives up after 15 minutes.
		backoff.WithMaxElapsedTime(orDefault(c.MaxElapsedTime, DefaultMaxElapsedTime)),
		backoff.WithRandomizationFactor(randomization),
	)
	attempts, permanent := 0, false
	ev, err := backoff.RetryWithData(func() (event.Event, error) {
		attempts++
		ev, err := c.attempt(ctx, target, jobID)
		var p *backoff.PermanentError
		permanent = errors.As(err, &p)
		return ev, err
	}, backoff.WithContext(b, ctx))
	switch {
	case err == nil:
		return ev, nil
	case ctx.Err() != nil:
		return event.Event{}, fmt.Errorf("snapshot: fetch %q: %w", jobID, ctx.Err())
	case permanent:
		return event.Event{}, fmt.Errorf("snapshot: fetch %q: %w", jobID, err)
	}
	return event.Event{}, fmt.Errorf("snapshot: fetch %q: gave up after %d attempts: %w", jobID, attempts, err)
}

// EscapeJobID is jobID as one path segment that reaches the authority
// unchanged through servers and proxies that normalise paths: every byte
// outside RFC 3986's unreserved set (letters, digits, '-', '.', '_', '~')
// is percent-encoded, '/' included, so the id is always a single segment;
// and an id made only of dots is encoded whole (".." becomes "%2E%2E"), so
// it is never a dot segment that path cleaning would resolve. A server
// that decodes each segment once (Go's ServeMux PathValue, url.PathUnescape)
// gets jobID back.
func EscapeJobID(jobID string) string {
	const hex = "0123456789ABCDEF"
	allDots := strings.Trim(jobID, ".") == ""
	var b strings.Builder
	b.Grow(len(jobID) * 3)
	for i := 0; i < len(jobID); i++ {
		c := jobID[i]
		if unreserved(c) && !(c == '.' && allDots) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// errBadAnswer marks a 200 whose body is not a snapshot of the job asked
// for.
var errBadAnswer = errors.New("the authority answered 200 with a bad snapshot")

// attempt makes one request. It alone decides what is retried: what it
// wraps in backoff.Permanent is not.
func (c *Client) attempt(ctx context.Context, target, jobID string) (event.Event, error) {
	if err := ctx.Err(); err != nil {
		return event.Event{}, backoff.Permanent(err)
	}
	// The slot is taken before the timeout starts, so waiting behind other
	// fetches does not count against this request's time.
	ln := c.lanes()
	// A request cut for slowness ends with the cut's error as its cause.
	cutCtx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	slot, err := ln.acquire(ctx, cut)
	if err != nil {
		return event.Event{}, backoff.Permanent(err)
	}
	defer slot.release()
	start := time.Now()

	timeout := orDefault(c.Timeout, DefaultTimeout)
	if d, ok := ctx.Value(requestTimeoutKey{}).(time.Duration); ok {
		timeout = d
	}
	reqCtx, cancel := context.WithTimeout(cutCtx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, target, nil)
	if err != nil {
		return event.Event{}, backoff.Permanent(err)
	}
	req.Header.Set("Accept", "application/json")

	resp, err := c.httpClient(target).Do(req)
	if err != nil {
		var refused *RedirectError
		if errors.As(err, &refused) {
			return event.Event{}, backoff.Permanent(refused)
		}
		return event.Event{}, c.transportError(ctx, reqCtx, timeout, err)
	}
	defer func() {
		// Drain a little so the connection can be reused; an oversized
		// body is left to the close.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		_ = resp.Body.Close()
		// Whatever it said, the authority answered: its time counts
		// towards the median that tells slow requests apart. A request
		// cut for slowness did not answer, though its status line came:
		// the lanes count it themselves, or not at all.
		if !cutForSlowness(cutCtx) {
			ln.observe(time.Since(start))
		}
	}()

	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusGone:
		return c.gone(ctx, reqCtx, timeout, resp.Body, jobID)
	case http.StatusNotFound:
		return event.Event{}, backoff.Permanent(ErrNotFound)
	default:
		return event.Event{}, fmt.Errorf("the authority answered %s%s", resp.Status, excerpt(resp.Body))
	}

	// One byte over the limit is enough for DecodeValue to refuse it
	// without reading the rest.
	body, err := io.ReadAll(io.LimitReader(resp.Body, event.MaxValueBytes+1))
	if err != nil {
		return event.Event{}, c.transportError(ctx, reqCtx, timeout, fmt.Errorf("read body: %w", err))
	}
	ev, err := event.DecodeValue(body)
	if err != nil {
		return event.Event{}, backoff.Permanent(fmt.Errorf("%w: %w", errBadAnswer, err))
	}
	if !ev.Kind.WholeState() {
		return event.Event{}, backoff.Permanent(fmt.Errorf("%w: kind is %q, want %q or %q", errBadAnswer, ev.Kind, event.Snapshot, event.Delete))
	}
	if ev.JobID != jobID {
		return event.Event{}, backoff.Permanent(fmt.Errorf("%w: job_id is %q, want %q", errBadAnswer, ev.JobID, jobID))
	}
	return ev, nil
}

// errBadGone marks a 410 whose body does not say at which version the
// job was deleted.
var errBadGone = errors.New(`the authority answered 410 Gone without a valid version: the body must be a JSON object such as {"version": 7}`)

// gone reads a 410 Gone answer: the job was deleted, at the version the
// body gives. The body is a delete record value, or any JSON object with a
// "version"; a "job_id" in it must be the job asked for.
func (c *Client) gone(ctx, reqCtx context.Context, timeout time.Duration, body io.Reader, jobID string) (event.Event, error) {
	raw, err := io.ReadAll(io.LimitReader(body, event.MaxValueBytes+1))
	if err != nil {
		return event.Event{}, c.transportError(ctx, reqCtx, timeout, fmt.Errorf("read body: %w", err))
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil || members == nil {
		return event.Event{}, backoff.Permanent(fmt.Errorf("%w%s", errBadGone, excerpt(strings.NewReader(string(raw)))))
	}
	// The missing members are written before the body's own, which are
	// decoded as the authority wrote them: a map would keep one of two
	// members of the same name, where the decoder refuses both.
	var missing []byte
	if _, ok := members["job_id"]; !ok {
		id, _ := json.Marshal(jobID)
		missing = append(append(append(missing, `"job_id":`...), id...), ',')
	}
	if _, ok := members["kind"]; !ok {
		missing = append(missing, `"kind":"delete",`...)
	}
	rest := bytes.TrimSpace(raw)[1:] // after the '{'
	if len(missing) > 0 && bytes.TrimSpace(rest)[0] == '}' {
		missing = missing[:len(missing)-1] // no member follows
	}
	value := append(append([]byte{'{'}, missing...), rest...)
	ev, err := event.DecodeValue(value)
	switch {
	case err != nil:
		return event.Event{}, backoff.Permanent(fmt.Errorf("%w: %w", errBadGone, err))
	case ev.Kind != event.Delete:
		return event.Event{}, backoff.Permanent(fmt.Errorf("%w: kind is %q, want %q", errBadGone, ev.Kind, event.Delete))
	case ev.JobID != jobID:
		return event.Event{}, backoff.Permanent(fmt.Errorf("%w: job_id is %q, want %q", errBadGone, ev.JobID, jobID))
	}
	return ev, nil
}

// transportError makes a failed request's error say whose deadline ran
// out. The caller's cancellation is permanent, and so is a cut (asked
// again at once, the request would start in the main lane again), and so
// is a timeout (asked again with the same time, it would be cut again);
// everything else is retried.
func (c *Client) transportError(ctx, reqCtx context.Context, timeout time.Duration, err error) error {
	if ctx.Err() != nil {
		return backoff.Permanent(ctx.Err())
	}
	if cutForSlowness(reqCtx) {
		return backoff.Permanent(context.Cause(reqCtx))
	}
	if errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
		terr := &TimeoutError{Timeout: timeout, Err: err}
		if _, perJob := ctx.Value(requestTimeoutKey{}).(time.Duration); perJob {
			// The caller grows the time itself: asked again with the
			// same, the request would be cut again.
			return backoff.Permanent(terr)
		}
		// A caller without a time of its own (verify) retries within
		// the fetch: a transiently slow answer is not a failure.
		return terr
	}
	return err
}

type requestTimeoutKey struct{}

// WithRequestTimeout marks ctx so that the requests Fetch makes with it
// run up to d, body included, rather than the client's Timeout: a caller
// that keeps a timeout per job (one that grows each time a request is cut
// by it) passes it here.
func WithRequestTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, requestTimeoutKey{}, d)
}

// TimeoutError is a request cut by its timeout: the authority gave no
// answer within Timeout. It matches [ErrSlow]. It ends the fetch: asked
// again with the same time, the answer would be cut again, so the caller
// decides how long the next request gets ([WithRequestTimeout]) and, as
// for any job found slow, starts it in the slow lane ([InSlowLane]).
type TimeoutError struct {
	// Timeout is the time the request ran with: the authority takes at
	// least that long to answer this job.
	Timeout time.Duration
	Err     error
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("no answer within %s: %v", e.Timeout, e.Err)
}

func (e *TimeoutError) Unwrap() error { return e.Err }

// Is reports that a timeout is a slow outcome: the job is found slow.
func (e *TimeoutError) Is(target error) bool { return target == ErrSlow }

// cutForSlowness reports whether ctx was ended by the lanes' cut.
func cutForSlowness(ctx context.Context) bool {
	cause := context.Cause(ctx)
	return errors.Is(cause, ErrSlow) || errors.Is(cause, ErrSlowLaneFull)
}

func (c *Client) lanes() *lanes {
	c.lanesOnce.Do(func() {
		n := c.MaxConcurrent
		if n <= 0 {
			n = DefaultMaxConcurrent
		}
		c.ln = newLanes(n, c.SlowConcurrent)
	})
	return c.ln
}

// excerpt returns the start of an error answer's body for the error
// message: authorities often say there why they failed.
func excerpt(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, 200))
	s := strings.Join(strings.Fields(strings.ToValidUTF8(string(b), "\uFFFD")), " ")
	if s == "" {
		return ""
	}
	return ": " + s
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
