package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// A broker that accepts connections and never answers holds whatever
// connects to it until that connection's own deadline: kafka-go's consumer
// group connects to the first broker of --brokers that accepts TCP and
// never falls back, and a leader lookup that asked it first spent its
// whole budget there. The projector asks every broker it knows a small
// request every brokerProbeEvery; one that does not answer within
// brokerProbeTimeout is avoided (a connection to it fails at once, so the
// client moves on to the next broker) until it answers again. While every
// broker fails, none is avoided.

// brokerProbeEvery and brokerProbeTimeout pace the probes.
const (
	brokerProbeEvery   = 3 * time.Second
	brokerProbeTimeout = 3 * time.Second
)

// BrokerWatch knows which brokers answer.
type BrokerWatch struct {
	// probe dials a broker with the projector's dialer (TLS, SASL) but not
	// through the watch.
	probe *kafkago.Dialer
	log   *slog.Logger

	mu sync.Mutex
	// known are the brokers' addresses: --brokers and what metadata named.
	known []string
	// down holds the brokers that did not answer, since when.
	down map[string]time.Time
}

func newBrokerWatch(probe *kafkago.Dialer, brokers []string) *BrokerWatch {
	return &BrokerWatch{probe: probe, known: append([]string(nil), brokers...), down: map[string]time.Time{}, log: slog.New(slog.DiscardHandler)}
}

// errBrokerAvoided is a connection refused by the watch itself.
var errBrokerAvoided = errors.New("the broker accepts connections but does not answer; avoided while others do")

// avoided reports whether a connection to address should fail at once.
func (b *BrokerWatch) avoided(address string) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.down[address]; !ok {
		return false
	}
	return len(b.down) < len(b.known)
}

// guard wraps dial so that it refuses the brokers that do not answer.
func (b *BrokerWatch) guard(dial func(ctx context.Context, network, address string) (net.Conn, error)) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		if b.avoided(address) {
			return nil, fmt.Errorf("%s: %w", address, errBrokerAvoided)
		}
		return dial(ctx, network, address)
	}
}

// Run probes the known brokers until ctx ends, logging to log the
// brokers it starts and stops avoiding.
func (b *BrokerWatch) Run(ctx context.Context, log *slog.Logger) {
	b.mu.Lock()
	b.log = log
	b.mu.Unlock()
	t := time.NewTicker(brokerProbeEvery)
	defer t.Stop()
	for {
		b.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round probes every known broker at once and records who answered.
func (b *BrokerWatch) round(ctx context.Context) {
	b.mu.Lock()
	known := append([]string(nil), b.known...)
	b.mu.Unlock()
	type answer struct {
		addr    string
		err     error
		brokers []kafkago.Broker
	}
	answers := make(chan answer, len(known))
	var wg sync.WaitGroup
	for _, a := range known {
		wg.Go(func() {
			brokers, err := b.ask(ctx, a)
			answers <- answer{a, err, brokers}
		})
	}
	wg.Wait()
	close(answers)
	if ctx.Err() != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for ans := range answers {
		since, wasDown := b.down[ans.addr]
		switch {
		case ans.err == nil && wasDown:
			delete(b.down, ans.addr)
			b.log.Info("Kafka broker answers again; connections to it are no longer avoided", "broker", ans.addr,
				"did_not_answer_for", time.Since(since).Round(time.Second).String())
		case ans.err != nil && !wasDown:
			b.down[ans.addr] = time.Now()
			b.log.Warn("Kafka broker does not answer; connections to it are avoided while other brokers do (its partitions and groups are served by others only after the cluster moves them)",
				"broker", ans.addr, "err", ans.err)
		}
		for _, br := range ans.brokers {
			addr := net.JoinHostPort(br.Host, strconv.Itoa(br.Port))
			found := false
			for _, k := range b.known {
				found = found || k == addr
			}
			if !found {
				b.known = append(b.known, addr)
			}
		}
	}
}

// ask sends addr a metadata request and returns the brokers it names.
func (b *BrokerWatch) ask(ctx context.Context, addr string) ([]kafkago.Broker, error) {
	pctx, cancel := context.WithTimeout(ctx, brokerProbeTimeout)
	defer cancel()
	conn, err := b.probe.DialContext(pctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(pctx, func() { conn.Close() })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(brokerProbeTimeout))
	brokers, err := conn.Brokers()
	if err != nil && pctx.Err() != nil {
		return nil, fmt.Errorf("no answer within %s", brokerProbeTimeout)
	}
	return brokers, err
}
