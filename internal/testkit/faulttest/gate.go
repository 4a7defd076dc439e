package faulttest

import (
	"net"
	"sync"
)

// Gate controls every connection handed to it: [Gate.Cut] drops them all
// and refuses new ones, [Gate.Stall] holds every byte in both directions
// (the peer sees a connection that neither answers nor closes), and
// [Gate.Restore] lets traffic through again. A held read or write resumes
// where it was, so a stall loses nothing.
type Gate struct {
	mu      sync.Mutex
	cut     bool
	stalled bool
	resume  chan struct{} // closed by Restore while stalled
	conns   map[*gatedConn]struct{}
}

// NewGate returns an open gate.
func NewGate() *Gate {
	return &Gate{conns: map[*gatedConn]struct{}{}, resume: make(chan struct{})}
}

// Cut drops every connection and refuses new ones until [Gate.Restore].
func (g *Gate) Cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cut = true
	if g.stalled {
		// A cut ends a stall: what was held fails now.
		g.stalled = false
		close(g.resume)
	}
	for c := range g.conns {
		_ = c.Conn.Close()
	}
}

// Stall holds all traffic until [Gate.Restore]; new connections are
// accepted and held too.
func (g *Gate) Stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.stalled {
		g.stalled = true
		g.resume = make(chan struct{})
	}
}

// Restore ends a cut or a stall.
func (g *Gate) Restore() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cut = false
	if g.stalled {
		g.stalled = false
		close(g.resume)
	}
}

// wait blocks while the gate is stalled; it reports false once cut.
func (g *Gate) wait() bool {
	g.mu.Lock()
	cut, stalled, resume := g.cut, g.stalled, g.resume
	g.mu.Unlock()
	if stalled {
		<-resume
		return g.open()
	}
	return !cut
}

func (g *Gate) open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.cut
}

// admit wraps c, or closes it and returns nil while the gate is cut.
func (g *Gate) admit(c net.Conn) net.Conn {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cut {
		_ = c.Close()
		return nil
	}
	gc := &gatedConn{Conn: c, g: g}
	g.conns[gc] = struct{}{}
	return gc
}

func (g *Gate) forget(c *gatedConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.conns, c)
}

// gatedConn is a connection whose reads and writes pass the gate.
type gatedConn struct {
	net.Conn
	g *Gate
}

func (c *gatedConn) Read(b []byte) (int, error) {
	if !c.g.wait() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	// Bytes read while a stall began are held until it ends.
	if n > 0 && !c.g.wait() {
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if !c.g.wait() {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) Close() error {
	c.g.forget(c)
	return c.Conn.Close()
}

// Listener returns a listen function for kfake.ListenFn that puts every
// connection the broker accepts behind g: the broker's advertised
// addresses stay its own, so clients cannot route around the gate the way
// they would around a proxy.
func (g *Gate) Listener() func(network, address string) (net.Listener, error) {
	return func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		return &gatedListener{Listener: ln, g: g}, nil
	}
}

type gatedListener struct {
	net.Listener
	g *Gate
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(c); gc != nil {
			return gc, nil
		}
	}
}
