package snapshot

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Redirects is which redirects of the authority a [Client] follows.
type Redirects string

const (
	// SameOrigin follows a redirect only to the authority's own origin
	// (the scheme, host and port of BaseURL), at most [MaxRedirects]
	// times per request. The authority is trusted as an origin: a
	// redirect to another host would have that host's answer written as
	// the trusted state.
	SameOrigin Redirects = "same-origin"
	// NoRedirects follows none.
	NoRedirects Redirects = "none"
)

// MaxRedirects is how many redirects one request follows under
// [SameOrigin]: a loop costs at most this many more requests per attempt.
const MaxRedirects = 5

// ParseRedirects reads a [Redirects] by its name.
func ParseRedirects(s string) (Redirects, error) {
	switch r := Redirects(s); r {
	case SameOrigin, NoRedirects:
		return r, nil
	}
	return "", fmt.Errorf("%q is not %s or %s", s, SameOrigin, NoRedirects)
}

// RedirectError is a redirect of the authority that was not followed. It
// ends the fetch: asked again, the authority would send the same one.
type RedirectError struct {
	// To is where the authority redirected, without user info.
	To string
	// Why is the rule the redirect broke.
	Why string
}

func (e *RedirectError) Error() string {
	return fmt.Sprintf("the authority redirected to %s, not followed: %s", e.To, e.Why)
}

// httpClient is the client that sends one request of c to target: c.HTTP
// with c's redirect rule checked before its own CheckRedirect, if any.
func (c *Client) httpClient(target string) *http.Client {
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	own := *hc
	origin := originOf(target)
	mode := c.Redirects
	own.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		// Where it would have gone, without its query (a presigned
		// URL's signature) and bounded: this text reaches logs, held rows
		// and /status.
		u := *req.URL
		u.RawQuery, u.Fragment, u.User = "", "", nil
		to := u.String()
		if len(to) > 200 {
			to = to[:200] + "..."
		}
		switch {
		case mode == NoRedirects:
			return &RedirectError{To: to, Why: "redirects are turned off"}
		case mode != SameOrigin && mode != "":
			return &RedirectError{To: to, Why: fmt.Sprintf("unknown redirect rule %q", mode)}
		case origin == "" || originOf(req.URL.String()) != origin:
			return &RedirectError{To: to, Why: "another origin than the authority's " + origin}
		case len(via) > MaxRedirects:
			return &RedirectError{To: to, Why: fmt.Sprintf("more than %d redirects in one request", MaxRedirects)}
		}
		if hc.CheckRedirect != nil {
			return hc.CheckRedirect(req, via)
		}
		return nil
	}
	return &own
}

// originOf is rawURL's scheme, host and port, the port written out when
// it is the scheme's default, so that http://a and http://a:80 are one
// origin. A URL that does not parse has none.
func originOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return ""
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}
