package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
	"github.com/projector/projector/wait"
)

// apiFlags configure the read-your-writes long-poll (run only).
type apiFlags struct {
	// addr is where /wait is served; empty: not served.
	addr       string
	maxWaiters int
	// notify announces every batch whether or not a waiter holds a lease.
	notify bool
}

// waitPoolConns bounds the waiters' own pool: their reads never take a
// connection from the projector's batches (the listening connection is
// one more, out of any pool).
const waitPoolConns = 2

func (a *apiFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&a.notify, "notify", false, "announce every committed batch on the projection's PostgreSQL channel even\nwhen no waiter holds a lease. Off, a batch is announced only while some\nprocess serves waits (--api-addr, the Go package wait), which every instance\nsees in the database; turn it on for clients that LISTEN themselves or whose\nrole may not write projector_wait_leases. --api-addr implies it")
	fs.StringVar(&a.addr, "api-addr", "", "address of the read-your-writes long-poll GET /wait (by job and version, or\nby partition and offset); empty: not served. Unlike --http-addr, an address\nthat cannot be bound stops the start (exit 1): clients depend on it")
	fs.IntVar(&a.maxWaiters, "api-max-waiters", wait.DefaultMaxWaiters, "most requests /wait holds at once on this instance; beyond, it answers 503")
}

func (a *apiFlags) validate() error {
	if a.addr != "" {
		_, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			return usagef("--api-addr %q: want [host]:port such as :8081 or 127.0.0.1:8081", a.addr)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return usagef("--api-addr %q: the port %q is not a number from 0 to 65535", a.addr, port)
		}
	}
	if a.maxWaiters < 1 {
		return usagef("--api-max-waiters %d: must be at least 1", a.maxWaiters)
	}
	return nil
}

// serve starts the waiters and /wait when --api-addr is set; stop answers
// the requests held (they are not dropped), then closes the server.
func (a *apiFlags) serve(ctx context.Context, databaseURL string, cfg store.Config, p *projection.Projector, topic string, logger *slog.Logger) (stop func(), err error) {
	if a.addr == "" {
		return func() {}, nil
	}
	pool, err := store.OpenPoolOf(ctx, databaseURL, waitPoolConns)
	if err != nil {
		return nil, fmt.Errorf("the waiters' pool: %w", err)
	}
	st, err := store.New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	w, err := wait.New(wait.Config{Store: st, MaxWaiters: a.maxWaiters, Logger: logger})
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := p.RegisterMetrics(w.Collectors()...); err != nil {
		pool.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", a.addr)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("--api-addr %s: %w", a.addr, err)
	}
	// The waiter stops with stop, after the projector's last batches
	// (run calls stop once Run returned), not at the signal: a wait that
	// the final commit reaches is answered 200.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = w.Run(runCtx)
	}()
	// No write timeout: a request waits up to wait.MaxTimeout by design.
	srv := &http.Server{Handler: wait.Handler(w, topic), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 16 << 10}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	logger.Info("serving /wait", "addr", ln.Addr().String(), "max_waiters", a.maxWaiters)
	return func() {
		cancel()
		<-ran
		sctx, done := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer done()
		_ = srv.Shutdown(sctx)
		<-served
		pool.Close()
	}, nil
}
