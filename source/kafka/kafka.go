package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/projector/projector/source"
	"github.com/projector/projector/source/kafka/kafkacfg"
)

// Config is where the brokers are and how to reach them
// ([kafkacfg.Config]); SASL a mechanism and its credentials.
type (
	Config = kafkacfg.Config
	SASL   = kafkacfg.SASL
	// AuthError is a broker refusing our credentials or certificate
	// ([kafkacfg.AuthError]).
	AuthError = kafkacfg.AuthError
)

// Isolation levels and SASL mechanisms ([kafkacfg.ReadCommitted], ...).
const (
	ReadCommitted   = kafkacfg.ReadCommitted
	ReadUncommitted = kafkacfg.ReadUncommitted
	SASLPlain       = kafkacfg.SASLPlain
	SASLScramSHA256 = kafkacfg.SASLScramSHA256
	SASLScramSHA512 = kafkacfg.SASLScramSHA512
)

// ValidIsolation says what is wrong with an isolation level.
func ValidIsolation(iso string) error { return kafkacfg.ValidIsolation(iso) }

// mechanism is kafka-go's form of s; nil without SASL.
func mechanism(s *SASL) (sasl.Mechanism, error) {
	if s == nil {
		return nil, nil
	}
	switch s.Mechanism {
	case SASLPlain:
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case SASLScramSHA256:
		return scramMechanism(s, scram.SHA256)
	case SASLScramSHA512:
		return scramMechanism(s, scram.SHA512)
	}
	return nil, s.Validate()
}

// scramMechanism builds a SCRAM mechanism. The SCRAM library's error for
// a name or password SASLprep refuses quotes the password: it is never
// passed on.
func scramMechanism(s *SASL, algo scram.Algorithm) (sasl.Mechanism, error) {
	m, err := scram.Mechanism(algo, s.Username, s.Password)
	if err == nil {
		return m, nil
	}
	return nil, kafkacfg.ScramRefused(s, err)
}

// kafkaClients are the dialer (Conn, Reader, ConsumerGroup) and the
// transport (Client) of one [Kafka], sharing its TLS and SASL settings.
type Clients struct {
	k         Config
	Dialer    *kafkago.Dialer
	transport *kafkago.Transport
	Client    *kafkago.Client
	// watch knows which brokers answer; the dialer and the transport
	// avoid those that do not (once its probes run: [BrokerWatch.Run]).
	Watch *BrokerWatch
}

// Connect builds the dialer and the transport of k. The transport is the
// projector's own, never kafkago.DefaultTransport, whose metadata cache
// would read a topic created after it looked as unknown.
func Connect(k Config) (*Clients, error) {
	mech, err := mechanism(k.SASL)
	if err != nil {
		return nil, fmt.Errorf("projection: kafka: %w", err)
	}
	d := &kafkago.Dialer{ClientID: "projector", Timeout: 10 * time.Second, DualStack: true, TLS: k.TLS, SASLMechanism: mech}
	probe := *d
	probe.Timeout = brokerProbeTimeout
	watch := newBrokerWatch(&probe, k.Brokers)
	netDial := (&net.Dialer{Timeout: 10 * time.Second, DualStack: true}).DialContext
	d.DialFunc = watch.guard(netDial)
	t := &kafkago.Transport{ClientID: "projector", DialTimeout: 10 * time.Second, TLS: k.TLS, SASL: mech, MetadataTTL: 2 * time.Second,
		Dial: watch.guard(netDial)}
	return &Clients{
		k: k, Dialer: d, transport: t, Watch: watch,
		Client: &kafkago.Client{Addr: kafkago.TCP(k.Brokers...), Timeout: 10 * time.Second, Transport: t},
	}, nil
}

func (c *Clients) Close() { c.transport.CloseIdleConnections() }

// AsAuthError returns err as an *AuthError when it says the broker refused
// our credentials or certificate, or the TLS handshake failed for a reason
// a retry cannot fix; otherwise nil.
func AsAuthError(k Config, err error) *AuthError {
	if err == nil {
		return nil
	}
	var ae *AuthError
	if errors.As(err, &ae) {
		return ae
	}
	var (
		kerr      kafkago.Error
		alert     tls.AlertError
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		header    tls.RecordHeaderError
	)
	auth := false
	switch {
	case errors.As(err, &kerr):
		switch kerr {
		case kafkago.SASLAuthenticationFailed, kafkago.UnsupportedSASLMechanism, kafkago.IllegalSASLState,
			kafkago.TopicAuthorizationFailed, kafkago.GroupAuthorizationFailed, kafkago.ClusterAuthorizationFailed:
			auth = true
		}
	case errors.As(err, &alert), errors.As(err, &unknownCA), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &verify):
		auth = true
	case errors.As(err, &header):
		// A plain-text broker answering a TLS hello, or the reverse.
		auth = k.TLS != nil
	case k.TLS != nil && isRemoteTLSAlert(err):
		// The broker refused our certificate (or its absence) after the
		// handshake, as TLS 1.3 does: "remote error: tls: certificate
		// required".
		auth = true
	}
	if !auth {
		return nil
	}
	ae = &AuthError{TLS: k.TLS != nil, Err: err}
	if k.SASL != nil {
		ae.Mechanism, ae.User = k.SASL.Mechanism, k.SASL.Username
	}
	return ae
}

// LogEnd is where a partition's log ends ([source.LogEnd]).
type LogEnd = source.LogEnd

// LogEnds asks the brokers where the log of every partition of topic
// ends, for lag reporting and for where reading is complete.
func LogEnds(ctx context.Context, k Config, topic string) (map[int]LogEnd, error) {
	c, err := Connect(k)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// One round of probes first, so that a broker that does not answer
	// is avoided (status and rebuild run no probes of their own).
	c.Watch.round(ctx)
	return c.LogEnds(ctx, topic)
}

// LogStarts asks the brokers where the logs of partitions of topic begin
// (their first offsets).
func LogStarts(ctx context.Context, k Config, topic string, partitions []int) (map[int]int64, error) {
	c, err := Connect(k)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.Watch.round(ctx)
	return c.listOffsets(ctx, topic, partitions, kafkago.ReadUncommitted, true)
}

// errTopicMissing is a topic the brokers do not know.
var ErrTopicMissing = errors.New("topic does not exist")

// partitions lists topic's partitions from fresh metadata; a topic the
// brokers do not know is errTopicMissing.
func (c *Clients) partitions(ctx context.Context, topic string) ([]int, error) {
	meta, err := c.Client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		if ae := AsAuthError(c.k, err); ae != nil {
			return nil, ae
		}
		if ae := c.diagnose(ctx); ae != nil {
			return nil, ae
		}
		return nil, fmt.Errorf("projection: metadata of %s: %w", topic, err)
	}
	for _, t := range meta.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			if errors.Is(t.Error, kafkago.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("projection: topic %q: %w", topic, ErrTopicMissing)
			}
			if ae := AsAuthError(c.k, t.Error); ae != nil {
				return nil, ae
			}
			return nil, fmt.Errorf("projection: topic %s: %w", topic, t.Error)
		}
		ids := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("projection: topic %q: %w", topic, ErrTopicMissing)
		}
		return ids, nil
	}
	return nil, fmt.Errorf("projection: topic %q: %w", topic, ErrTopicMissing)
}

// logEnds reads the high watermarks and the last stable offsets of
// topic's partitions: two requests per leader, since a partition may be
// asked once per request.
func (c *Clients) LogEnds(ctx context.Context, topic string) (map[int]LogEnd, error) {
	ids, err := c.partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	hwm, err := c.lastOffsets(ctx, topic, ids, kafkago.ReadUncommitted)
	if err != nil {
		return nil, err
	}
	stable, err := c.lastOffsets(ctx, topic, ids, kafkago.ReadCommitted)
	if err != nil {
		return nil, err
	}
	out := make(map[int]LogEnd, len(hwm))
	for id, h := range hwm {
		s, ok := stable[id]
		if !ok {
			s = h
		}
		e := LogEnd{HighWatermark: h, LastStable: s, End: h}
		if c.k.ReadsCommitted() {
			e.End = s
		}
		out[id] = e
	}
	return out, nil
}

// lastOffsets lists the latest offsets of partitions ids of topic at an
// isolation level: their high watermarks reading uncommitted, their last
// stable offsets reading committed.
func (c *Clients) lastOffsets(ctx context.Context, topic string, ids []int, iso kafkago.IsolationLevel) (map[int]int64, error) {
	return c.listOffsets(ctx, topic, ids, iso, false)
}

// listOffsets lists the first (first) or the latest offsets of partitions
// ids of topic at an isolation level.
func (c *Clients) listOffsets(ctx context.Context, topic string, ids []int, iso kafkago.IsolationLevel, first bool) (map[int]int64, error) {
	reqs := make([]kafkago.OffsetRequest, len(ids))
	for i, id := range ids {
		reqs[i] = kafkago.LastOffsetOf(id)
		if first {
			reqs[i] = kafkago.FirstOffsetOf(id)
		}
	}
	res, err := c.Client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}, IsolationLevel: iso})
	if err != nil {
		if ae := AsAuthError(c.k, err); ae != nil {
			return nil, ae
		}
		return nil, fmt.Errorf("projection: list offsets of %s: %w", topic, err)
	}
	out := map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("projection: offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.LastOffset
		if first {
			out[po.Partition] = po.FirstOffset
		}
	}
	return out, nil
}

func isRemoteTLSAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// diagnose tells a refused authentication from a broker that is down: a
// broker that fails SASL closes the connection, which kafka-go's transport
// reports as a bare unexpected EOF. It dials each broker once with a
// mechanism that records how far the exchange got: a connection lost after
// the exchange started and before it completed is a refusal.
func (c *Clients) diagnose(ctx context.Context) *AuthError {
	if c.k.SASL == nil && c.k.TLS == nil {
		return nil
	}
	for _, addr := range c.k.Brokers {
		d := *c.Dialer
		var probe *probeMechanism
		if d.SASLMechanism != nil {
			probe = &probeMechanism{Mechanism: d.SASLMechanism}
			d.SASLMechanism = probe
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		if ae := AsAuthError(c.k, err); ae != nil {
			return ae
		}
		if probe != nil && probe.started.Load() && !probe.done.Load() && ctx.Err() == nil {
			ae := &AuthError{TLS: c.k.TLS != nil, Mechanism: c.k.SASL.Mechanism, User: c.k.SASL.Username,
				Err: fmt.Errorf("%s closed the connection during the SASL exchange (credentials refused): %w", addr, err)}
			return ae
		}
	}
	return nil
}

// probeMechanism records whether a SASL exchange started and completed.
type probeMechanism struct {
	sasl.Mechanism
	started, done atomic.Bool
}

func (m *probeMechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	m.started.Store(true)
	sm, ir, err := m.Mechanism.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return probeState{sm, m}, ir, nil
}

type probeState struct {
	sasl.StateMachine
	m *probeMechanism
}

func (s probeState) Next(ctx context.Context, challenge []byte) (bool, []byte, error) {
	done, resp, err := s.StateMachine.Next(ctx, challenge)
	if done && err == nil {
		s.m.done.Store(true)
	}
	return done, resp, err
}

// PartitionsFresh lists topic's partitions over a new connection: the
// transport caches metadata for a while, and a topic deleted a moment ago
// would still look present there. A topic the brokers do not know is
// errTopicMissing.
func (c *Clients) PartitionsFresh(ctx context.Context, topic string) ([]int, error) {
	var last error
	for _, addr := range c.k.Brokers {
		conn, err := c.Dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			if ae := AsAuthError(c.k, err); ae != nil {
				return nil, ae
			}
			last = err
			continue
		}
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(10 * time.Second)
		}
		_ = conn.SetDeadline(deadline)
		ps, err := conn.ReadPartitions(topic)
		conn.Close()
		switch {
		case errors.Is(err, kafkago.UnknownTopicOrPartition), err == nil && len(ps) == 0:
			return nil, fmt.Errorf("projection: topic %q: %w", topic, ErrTopicMissing)
		case err != nil:
			if ae := AsAuthError(c.k, err); ae != nil {
				return nil, ae
			}
			last = err
			continue
		}
		ids := make([]int, len(ps))
		for i, p := range ps {
			ids[i] = p.ID
		}
		return ids, nil
	}
	if ae := c.diagnose(ctx); ae != nil {
		return nil, ae
	}
	return nil, fmt.Errorf("projection: metadata of %s: %w", topic, last)
}
