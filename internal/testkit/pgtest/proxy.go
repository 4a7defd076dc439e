package pgtest

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector/projector/store"
)

// Proxy is a TCP proxy in front of the test server that a test can cut and
// restore, to play a database outage without touching the shared server.
// Cut closes every connection through it and refuses new ones (accepted,
// then closed at once, as a dead load balancer would); Restore lets them
// through again.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]*atomic.Bool
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to the server of [URL] on a loopback port and
// stops it when the test ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("%s: %v", howTo, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, upstream: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), conns: map[net.Conn]*atomic.Bool{}}
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

// URL is [URL] with its host and port replaced by the proxy's.
func (p *Proxy) URL(t testing.TB) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("%s: %v", howTo, err)
	}
	host, port, _ := net.SplitHostPort(p.Addr())
	c := cfg.ConnConfig
	u := "postgres://" + c.User
	if c.Password != "" {
		u += ":" + c.Password
	}
	return u + "@" + host + ":" + port + "/" + c.Database + "?sslmode=disable"
}

// Store returns a migrated store in a fresh schema, on a pool of its own
// that connects through the proxy; the pool is closed when the test ends.
func (p *Proxy) Store(t testing.TB) *store.Store {
	t.Helper()
	schema := Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(p.URL(t))
	if err != nil {
		t.Fatalf("pgtest: proxy url: %v", err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: pool through proxy: %v", err)
	}
	t.Cleanup(pool.Close)
	s, err := store.New(pool, store.Config{Schema: schema})
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("pgtest: migrate through proxy: %v", err)
	}
	return s
}

// Cut drops every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Freeze makes every connection open now go silent without closing: what
// either side sends is swallowed, as by a host gone or a firewall that
// drops a connection without a word. Connections opened afterwards pass.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, frozen := range p.conns {
		frozen.Store(true)
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		frozen := &atomic.Bool{}
		p.conns[c] = frozen
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(c, frozen) })
	}
}

func (p *Proxy) pipe(c net.Conn, frozen *atomic.Bool) {
	defer p.forget(c)
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		_ = up.Close()
		return
	}
	p.conns[up] = frozen
	p.mu.Unlock()
	defer p.forget(up)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, gate{c, frozen})
		_ = up.Close()
		close(done)
	}()
	_, _ = io.Copy(c, gate{up, frozen})
	_ = c.Close()
	<-done
}

func (p *Proxy) forget(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// gate reads from a connection, swallowing what it reads once frozen.
type gate struct {
	net.Conn
	frozen *atomic.Bool
}

func (g gate) Read(b []byte) (int, error) {
	for {
		n, err := g.Conn.Read(b)
		if err != nil || !g.frozen.Load() {
			return n, err
		}
	}
}
