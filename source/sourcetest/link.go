package sourcetest

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
)

// Link is the network between a source and its service, which a test can
// cut and restore to play an outage on a real service without stopping
// it: [Link.Cut] closes every connection through the link and refuses new
// ones (as a dead load balancer would), [Link.Restore] lets them through
// again. A client reaches the service through the link either by dialing
// with [Link.DialContext] (Kafka: the dialer's DialFunc, which also covers
// the broker addresses the metadata names) or through [Link.Proxy], a
// loopback TCP proxy to one address (an HTTP endpoint such as SQS's).
type Link struct {
	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewLink returns a link that is up, and closes what it holds when t
// ends.
func NewLink(t testing.TB) *Link {
	l := &Link{conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() {
		l.Cut()
		l.wg.Wait()
	})
	return l
}

// Cut drops every connection and refuses new ones until Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for c := range l.conns {
		_ = c.Close()
	}
	clear(l.conns)
}

// Restore lets connections through again.
func (l *Link) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = false
}

// errCut is what a dial through a cut link returns.
var errCut = &net.OpError{Op: "dial", Net: "tcp", Err: errString("connection refused: the link is cut")}

type errString string

func (e errString) Error() string { return string(e) }

// DialContext dials address unless the link is cut, and keeps the
// connection to close it at the next Cut.
func (l *Link) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	l.mu.Lock()
	cut := l.cut
	l.mu.Unlock()
	if cut {
		return nil, errCut
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if !l.track(c) {
		return nil, errCut
	}
	return c, nil
}

// track keeps c for the next Cut; false (and c closed) when the link was
// cut meanwhile.
func (l *Link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		_ = c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Link) forget(c net.Conn) {
	_ = c.Close()
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// Proxy starts a TCP proxy on a loopback port to upstream (host:port)
// through the link, stopped when t ends, and returns its address.
func (l *Link) Proxy(t testing.TB, upstream string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sourcetest: proxy: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	l.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !l.track(c) {
				continue
			}
			l.wg.Go(func() { l.pipe(c, upstream) })
		}
	})
	return ln.Addr().String()
}

func (l *Link) pipe(c net.Conn, upstream string) {
	defer l.forget(c)
	up, err := l.DialContext(context.Background(), "tcp", upstream)
	if err != nil {
		return
	}
	defer l.forget(up)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		_ = up.Close()
		close(done)
	}()
	_, _ = io.Copy(c, up)
	_ = c.Close()
	<-done
}
