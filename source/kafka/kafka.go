package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/projector/projector/source"
)

// Kafka is where the brokers are and how to reach them. Every connection
// the projector makes (group membership, fetches, the group offset commits,
// re-reads, offset lookups, status and rebuild) goes through the one
// dialer and the one transport [Config.Connect] builds from it.
type Config struct {
	Brokers []string
	// TLS, when not nil, encrypts every connection; its RootCAs,
	// Certificates and ServerName say whom to trust and who we are.
	TLS *tls.Config
	// SASL, when not nil, authenticates every connection.
	SASL *SASL
	// Isolation is how records written in transactions are read:
	// ReadCommitted (also when empty) or ReadUncommitted. Where a log
	// ends for lag, for a rebuild's target, for `--to latest`, is where a
	// reader at this level reads to: the last stable offset reading
	// committed, the high watermark otherwise.
	Isolation string
}

// Isolation levels: how records written in Kafka transactions are read.
const (
	// ReadCommitted reads as a Java consumer with
	// isolation.level=read_committed: a transaction's records once it has
	// committed, never those of an aborted one, and nothing past the last
	// stable offset (the first offset of the oldest transaction still
	// open, the high watermark with none).
	ReadCommitted = "read_committed"
	// ReadUncommitted reads every record as it is appended: those of
	// transactions still open, and of aborted ones, too.
	ReadUncommitted = "read_uncommitted"
)

// readCommitted reports whether k reads committed.
func (k Config) ReadsCommitted() bool { return k.Isolation != ReadUncommitted }

// validIsolation says what is wrong with an isolation level.
func ValidIsolation(iso string) error {
	switch iso {
	case "", ReadCommitted, ReadUncommitted:
		return nil
	}
	return fmt.Errorf("isolation: %q is not %s or %s", iso, ReadCommitted, ReadUncommitted)
}

// SASL mechanisms the projector speaks.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASL is a SASL mechanism and its credentials. Its String and LogValue
// never show the password.
type SASL struct {
	Mechanism string
	Username  string
	Password  string
}

func (s *SASL) String() string {
	if s == nil {
		return "none"
	}
	return fmt.Sprintf("%s user %q", s.Mechanism, s.Username)
}

// LogValue keeps the password out of logs.
func (s *SASL) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Validate says what is wrong with the mechanism or the credentials.
func (s *SASL) Validate() error {
	if s == nil {
		return nil
	}
	var errs []error
	switch s.Mechanism {
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
	default:
		errs = append(errs, fmt.Errorf("sasl mechanism %q: want %s, %s or %s", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512))
	}
	if s.Username == "" {
		errs = append(errs, errors.New("sasl: a username is required"))
	}
	if s.Password == "" {
		errs = append(errs, errors.New("sasl: a password is required"))
	}
	if len(errs) == 0 && s.Mechanism != SASLPlain {
		if _, err := s.mechanism(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *SASL) mechanism() (sasl.Mechanism, error) {
	if s == nil {
		return nil, nil
	}
	switch s.Mechanism {
	case SASLPlain:
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case SASLScramSHA256:
		return s.scram(scram.SHA256)
	case SASLScramSHA512:
		return s.scram(scram.SHA512)
	}
	return nil, s.Validate()
}

// scram builds a SCRAM mechanism. The SCRAM library's error for a name or
// password SASLprep refuses quotes the password: it is never passed on.
func (s *SASL) scram(algo scram.Algorithm) (sasl.Mechanism, error) {
	m, err := scram.Mechanism(algo, s.Username, s.Password)
	if err == nil {
		return m, nil
	}
	if strings.Contains(err.Error(), "password") {
		return nil, fmt.Errorf("sasl %s: the password of user %q holds characters SCRAM refuses (SASLprep: no control or unassigned characters)", s.Mechanism, s.Username)
	}
	return nil, fmt.Errorf("sasl %s: username %q holds characters SCRAM refuses (SASLprep: no control or unassigned characters)", s.Mechanism, s.Username)
}

// Validate says what is wrong with the brokers or the security settings.
func (k Config) Validate() error {
	var errs []error
	if len(k.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: at least one broker address (host:port) is required"))
	}
	for _, b := range k.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil || b == "" {
			errs = append(errs, fmt.Errorf("brokers: %q is not a host:port address", b))
		}
	}
	if err := k.SASL.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := ValidIsolation(k.Isolation); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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

// clients builds the dialer and the transport. The transport is the
// projector's own, never kafkago.DefaultTransport, whose metadata cache
// would read a topic created after it looked as unknown.
func (k Config) Connect() (*Clients, error) {
	mech, err := k.SASL.mechanism()
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

// AuthError is a broker refusing our credentials or certificate, or a TLS
// handshake that cannot succeed: retrying will not help, so the projector
// stops with it.
type AuthError struct {
	// Mechanism and User are the SASL settings in use, empty without SASL.
	Mechanism, User string
	TLS             bool
	Err             error
}

func (e *AuthError) Error() string {
	what := "kafka: authentication failed"
	switch {
	case e.Mechanism != "":
		what += fmt.Sprintf(" (SASL %s as user %q", e.Mechanism, e.User)
		if e.TLS {
			what += ", over TLS"
		}
		what += ")"
	case e.TLS:
		what += " (TLS)"
	}
	return what + ": " + e.Err.Error()
}

func (e *AuthError) Unwrap() error { return e.Err }

// authError returns err as an *AuthError when it says the broker refused
// our credentials or certificate, or the TLS handshake failed for a reason
// a retry cannot fix; otherwise nil.
func (k Config) AsAuthError(err error) *AuthError {
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
	c, err := k.Connect()
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
	c, err := k.Connect()
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
		if ae := c.k.AsAuthError(err); ae != nil {
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
			if ae := c.k.AsAuthError(t.Error); ae != nil {
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
		if ae := c.k.AsAuthError(err); ae != nil {
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
		if ae := c.k.AsAuthError(err); ae != nil {
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
			if ae := c.k.AsAuthError(err); ae != nil {
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
			if ae := c.k.AsAuthError(err); ae != nil {
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
