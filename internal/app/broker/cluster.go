package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultPartitions is the partition count [Cluster.CreateTopic] uses when
// asked for zero or fewer partitions, unless [WithDefaultPartitions] says
// otherwise.
const DefaultPartitions = 6

// minSessionTimeout is the lowest consumer-group session timeout the broker
// accepts. kfake's default minimum is 6 s (Kafka's
// group.min.session.timeout.ms); a JoinGroup below it fails with
// INVALID_SESSION_TIMEOUT. Lowered so tests may pick short sessions.
const minSessionTimeout = 100 * time.Millisecond

// segmentBytes is the size at which the broker rolls a partition's log
// segment. kfake keeps a segment in memory as one byte slice that doubles
// as it fills, copying all of it, in the goroutine that serves every
// request: at its default of 100 MiB a partition's growth from 64 MiB
// stopped produce and fetch alike for 100-400 ms, every partition about
// at once. Kafka appends to a file; with 8 MiB segments the largest copy
// is of 4 MiB.
const segmentBytes = 8 << 20

// pollInterval is how often the helpers re-check a condition the broker
// should already satisfy (kfake applies admin requests before answering).
const pollInterval = 10 * time.Millisecond

// Cluster is an in-process Kafka-protocol broker on loopback TCP.
//
// It is safe for concurrent use. Close it when done; [New] does that for a
// test.
type Cluster struct {
	kf    *kfake.Cluster
	addrs []string

	// transport is this cluster's own, never kafka.DefaultTransport: a
	// transport caches metadata per broker address, and a shared one that
	// cached an earlier cluster's (or an earlier moment's) view reads new
	// topics and partitions as unknown until its TTL runs out.
	transport *kafka.Transport
	client    *kafka.Client
	dialer    *kafka.Dialer
}

// Option configures [Start].
type Option func(*config)

type config struct {
	brokers    int
	partitions int
	kfakeOpts  []kfake.Opt
	clientTLS  *tls.Config
	clientSASL sasl.Mechanism
}

// WithBrokers sets the number of brokers, overriding the default of one.
// More than one spreads partition leaders and the group coordinator across
// ports, which only matters to tests of routing.
func WithBrokers(n int) Option { return func(c *config) { c.brokers = n } }

// WithDefaultPartitions sets the partition count used by
// [Cluster.CreateTopic] when it is given zero or fewer, overriding
// [DefaultPartitions].
func WithDefaultPartitions(n int) Option { return func(c *config) { c.partitions = n } }

// WithKfakeOptions passes options straight to kfake.NewCluster, after ours,
// so they win (for example kfake.WithLogger, kfake.BrokerConfigs, or
// kfake.AllowAutoTopicCreation for a test that wants it).
func WithKfakeOptions(opts ...kfake.Opt) Option {
	return func(c *config) { c.kfakeOpts = append(c.kfakeOpts, opts...) }
}

// WithClientSecurity makes this package's own clients (topic creation,
// produce, high watermarks) connect with TLS and SASL, for a broker started
// with kfake's TLS or EnableSASL options (passed with [WithKfakeOptions]).
func WithClientSecurity(tlsConfig *tls.Config, mechanism sasl.Mechanism) Option {
	return func(c *config) { c.clientTLS, c.clientSASL = tlsConfig, mechanism }
}

// Start starts a broker listening on 127.0.0.1 at ports the system picks.
//
// Defaults: one broker; automatic topic creation off (see the package doc);
// [DefaultPartitions] partitions for a topic created with a non-positive
// count; group session timeouts accepted down to 100 ms so tests can
// use the short timings of [Cluster.GroupConfig]. Everything is kept in
// memory.
func Start(opts ...Option) (*Cluster, error) {
	cfg := config{brokers: 1, partitions: DefaultPartitions}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.brokers < 1 {
		return nil, fmt.Errorf("broker: start: %d brokers, need at least one", cfg.brokers)
	}
	if cfg.partitions < 1 {
		return nil, fmt.Errorf("broker: start: %d default partitions, need at least one", cfg.partitions)
	}

	kopts := []kfake.Opt{
		kfake.NumBrokers(cfg.brokers),
		kfake.DefaultNumPartitions(cfg.partitions),
		kfake.GroupMinSessionTimeout(minSessionTimeout),
		kfake.ClusterID("kafkatest"),
		kfake.BrokerConfigs(map[string]string{"log.segment.bytes": strconv.Itoa(segmentBytes)}),
	}
	kopts = append(kopts, cfg.kfakeOpts...)
	kf, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("broker: start: %w", err)
	}

	c := connect(kf.ListenAddrs(), cfg)
	c.kf = kf
	return c, nil
}

// Connect is a [Cluster] for a broker started elsewhere (another process)
// at addrs: its helpers (topics, produce, high watermarks) work as on one
// from [Start]; Kfake returns nil and Close only drops this side's
// connections. Of the options only [WithClientSecurity] applies: the
// others configure the broker, which its own process has already done
// ([WithBrokers], [WithKfakeOptions] and [WithDefaultPartitions] are
// ignored).
func Connect(addrs []string, opts ...Option) *Cluster {
	cfg := config{partitions: DefaultPartitions}
	for _, o := range opts {
		o(&cfg)
	}
	return connect(addrs, cfg)
}

func connect(addrs []string, cfg config) *Cluster {
	transport := &kafka.Transport{
		// A safety net only: the helpers that change metadata drop the
		// cache themselves (see refreshMetadata). Anything else that
		// changes it (a test calling kfake directly) is seen within a
		// second rather than kafka-go's default of up to 6 s.
		MetadataTTL: time.Second,
		ClientID:    "kafkatest",
		TLS:         cfg.clientTLS,
		SASL:        cfg.clientSASL,
	}
	return &Cluster{
		addrs:     addrs,
		transport: transport,
		client:    &kafka.Client{Addr: kafka.TCP(addrs...), Transport: transport},
		dialer:    &kafka.Dialer{ClientID: "kafkatest", Timeout: 5 * time.Second, TLS: cfg.clientTLS, SASLMechanism: cfg.clientSASL},
	}
}

// Addrs returns the brokers' "127.0.0.1:port" addresses, for kafka-go's
// Brokers fields and kafka.TCP.
func (c *Cluster) Addrs() []string { return append([]string(nil), c.addrs...) }

// Kfake returns the underlying broker, for what this package does not wrap:
// error injection with ControlKey, Compact, MoveTopicPartition; nil for a
// broker of [Connect].
func (c *Cluster) Kfake() *kfake.Cluster { return c.kf }

// Close closes this package's idle connections and, for a broker of
// [Start], stops it: clients still connected see their connections drop.
// For a broker of [Connect] it leaves the broker running. Calling it twice
// is harmless.
func (c *Cluster) Close() {
	c.transport.CloseIdleConnections()
	if c.kf != nil {
		c.kf.Close()
	}
}

// CreateTopic creates topic with the given partition count (zero or fewer:
// the cluster default) and optional topic configs (for example
// cleanup.policy=compact before a Compact test), and returns once a fresh
// metadata request shows every partition. It fails if the topic exists.
func (c *Cluster) CreateTopic(ctx context.Context, topic string, partitions int, configs ...kafka.ConfigEntry) error {
	n := partitions
	if n <= 0 {
		n = -1 // the broker's default, set by WithDefaultPartitions
	}
	resp, err := c.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{
			Topic:             topic,
			NumPartitions:     n,
			ReplicationFactor: 1,
			ConfigEntries:     configs,
		}},
	})
	if err != nil {
		return fmt.Errorf("broker: create topic %s: %w", topic, err)
	}
	if err := resp.Errors[topic]; err != nil {
		return fmt.Errorf("broker: create topic %s: %w", topic, err)
	}
	if partitions <= 0 {
		partitions = 1 // any count will do; we do not know the default here
	}
	if err := c.waitPartitions(ctx, topic, partitions); err != nil {
		return fmt.Errorf("broker: create topic %s: %w", topic, err)
	}
	c.refreshMetadata()
	return nil
}

// AddPartitions grows topic to total partitions and returns once a fresh
// metadata request shows them all. Existing partitions keep their records, so
// keys routed by hash move (the repartition a projector must survive).
func (c *Cluster) AddPartitions(ctx context.Context, topic string, total int) error {
	resp, err := c.client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: topic, Count: int32(total)}},
	})
	if err != nil {
		return fmt.Errorf("broker: add partitions %s to %d: %w", topic, total, err)
	}
	if err := resp.Errors[topic]; err != nil {
		return fmt.Errorf("broker: add partitions %s to %d: %w", topic, total, err)
	}
	if err := c.waitPartitions(ctx, topic, total); err != nil {
		return fmt.Errorf("broker: add partitions %s to %d: %w", topic, total, err)
	}
	// CreateTopics refreshes the transport's metadata cache by itself;
	// CreatePartitions does not, and Produce to a new partition would fail
	// with an unknown partition until the cache's TTL ran out.
	c.refreshMetadata()
	return nil
}

// Partitions returns topic's partition count, from a metadata request sent to
// the broker (never a cache).
func (c *Cluster) Partitions(ctx context.Context, topic string) (int, error) {
	ps, err := c.readPartitions(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("broker: partitions of %s: %w", topic, err)
	}
	return len(ps), nil
}

// readPartitions asks a broker over a fresh connection, bypassing the
// transport's metadata cache.
func (c *Cluster) readPartitions(ctx context.Context, topic string) ([]kafka.Partition, error) {
	conn, err := c.dialer.DialContext(ctx, "tcp", c.addrs[0])
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	return conn.ReadPartitions(topic)
}

// waitPartitions polls fresh metadata until topic shows at least n
// partitions.
func (c *Cluster) waitPartitions(ctx context.Context, topic string, n int) error {
	var last error
	err := poll(ctx, func() bool {
		ps, err := c.readPartitions(ctx, topic)
		if err != nil {
			last = err
			return false
		}
		if len(ps) < n {
			last = fmt.Errorf("metadata shows %d partitions, want %d", len(ps), n)
			return false
		}
		return true
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %w)", err, last)
	}
	return err
}

// refreshMetadata drops the transport's connection pools, and with them the
// cached metadata; the next request builds a pool that reads metadata
// afresh. Requests in flight keep their pool until they finish.
func (c *Cluster) refreshMetadata() { c.transport.CloseIdleConnections() }

// poll calls done until it reports true or ctx ends.
func poll(ctx context.Context, done func() bool) error {
	if done() {
		return nil
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
			if done() {
				return nil
			}
		}
	}
}
