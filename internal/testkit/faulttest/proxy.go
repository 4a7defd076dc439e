package faulttest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a loopback port in front of upstream, for
// example the shared PostgreSQL server: the test points the process under
// test at [Proxy.Addr] and cuts or stalls the path through [Proxy.Gate],
// never touching the server the rest of the suite uses.
type Proxy struct {
	*Gate
	ln       net.Listener
	upstream string
	wg       sync.WaitGroup
}

// NewProxy starts a proxy to upstream (host:port) and stops it, dropping
// every connection, when t ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faulttest: proxy to %s: %v", upstream, err)
	}
	p := &Proxy{Gate: NewGate(), ln: ln, upstream: upstream}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		gc := p.admit(c)
		if gc == nil {
			continue
		}
		p.wg.Go(func() { p.pipe(gc) })
	}
}

func (p *Proxy) pipe(c net.Conn) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(up, c)
		_ = up.Close()
	})
	_, _ = io.Copy(c, up)
	_ = c.Close()
	wg.Wait()
}
