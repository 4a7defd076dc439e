package snapshot_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/snapshot"
)

// TestFetchFollowsRedirectsWithinTheAuthorityOnly: the authority is
// trusted as an origin. A redirect to its own scheme, host and port is
// followed; one to another host is not, and that host is never asked (its
// answer would be written as the trusted state); with NoRedirects none is
// followed; and a redirect loop costs at most MaxRedirects more requests,
// once: the fetch ends rather than asking again.
func TestFetchFollowsRedirectsWithinTheAuthorityOnly(t *testing.T) {
	t.Parallel()

	other, otherRequests := serveMux(t, "GET /jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(snapshotValue(r.PathValue("id"), 99))
	})
	authority, requests := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/jobs/job-1":
			http.Redirect(w, r, "/v2/jobs/job-1", http.StatusFound)
		case "/v2/jobs/job-1":
			_, _ = w.Write(snapshotValue("job-1", 7))
		case "/jobs/elsewhere":
			http.Redirect(w, r, other.URL+"/jobs/elsewhere", http.StatusFound)
		case "/jobs/loop":
			http.Redirect(w, r, "/jobs/loop", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	})

	t.Run("same origin", func(t *testing.T) {
		c := client(t, authority)
		ev, err := c.Fetch(context.Background(), "job-1")
		require.NoError(t, err)
		require.Equal(t, int64(7), ev.Version)
	})

	t.Run("another host", func(t *testing.T) {
		before := requests.Load()
		c := client(t, authority)
		_, err := c.Fetch(context.Background(), "elsewhere")
		var re *snapshot.RedirectError
		require.ErrorAs(t, err, &re, "%v", err)
		require.Contains(t, err.Error(), other.URL+"/jobs/elsewhere")
		require.Contains(t, err.Error(), "another origin")
		require.Zero(t, otherRequests.Load(), "the other host was asked")
		require.EqualValues(t, 1, requests.Load()-before, "the same request would get the same redirect")
	})

	t.Run("none", func(t *testing.T) {
		before := requests.Load()
		c := client(t, authority)
		c.Redirects = snapshot.NoRedirects
		_, err := c.Fetch(context.Background(), "job-1")
		var re *snapshot.RedirectError
		require.ErrorAs(t, err, &re, "%v", err)
		require.Contains(t, err.Error(), "/v2/jobs/job-1")
		require.EqualValues(t, 1, requests.Load()-before)
	})

	t.Run("loop", func(t *testing.T) {
		before := requests.Load()
		c := client(t, authority)
		_, err := c.Fetch(context.Background(), "loop")
		var re *snapshot.RedirectError
		require.ErrorAs(t, err, &re, "%v", err)
		require.EqualValues(t, 1+snapshot.MaxRedirects, requests.Load()-before)
	})
}

// serveMux is [serve] with h under pattern alone.
func serveMux(t *testing.T, pattern string, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc(pattern, h)
	return serve(t, mux.ServeHTTP)
}

// TestFetchKeepsTheCallersRedirectCheck: a client's own CheckRedirect
// still runs, after the authority's rule.
func TestFetchKeepsTheCallersRedirectCheck(t *testing.T) {
	t.Parallel()
	authority, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/jobs/job-1" {
			http.Redirect(w, r, "/v2/jobs/job-1", http.StatusFound)
			return
		}
		_, _ = w.Write(snapshotValue("job-1", 7))
	})
	c := client(t, authority)
	c.MaxElapsedTime = 50 * time.Millisecond
	mine := errors.New("refused by the caller")
	c.HTTP.CheckRedirect = func(*http.Request, []*http.Request) error { return mine }
	_, err := c.Fetch(context.Background(), "job-1")
	require.ErrorIs(t, err, mine)
}

func TestParseRedirects(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"same-origin", "none"} {
		r, err := snapshot.ParseRedirects(s)
		require.NoError(t, err)
		require.Equal(t, snapshot.Redirects(s), r)
	}
	_, err := snapshot.ParseRedirects("any")
	require.ErrorContains(t, err, `"any" is not same-origin or none`)
}
