package projection

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/projector/projector/store"
)

// Config is everything the engine needs. Zero fields take the defaults of
// [Config.WithDefaults]; [Config.Validate] says what to fix.
type Config struct {
	Brokers []string
	Topic   string
	Group   string
	// Start is where a partition never seen by this projection begins:
	// "earliest" (default) or "latest".
	Start string
	// BatchSize caps the records per batch transaction.
	BatchSize int
	// BatchLinger is how long a batch waits for more records after its first.
	BatchLinger time.Duration
	// MaxWait is kafka-go's fetch wait, which is also its client-side
	// fetch deadline: keep it short.
	MaxWait time.Duration
	// Owner names this instance in the partitions table.
	Owner string
	// CacheSize bounds the per-partition cache of job versions.
	CacheSize int

	Store  *store.Store
	Logger *slog.Logger

	// Group timing; the defaults suit a real cluster.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	JoinGroupBackoff  time.Duration
	// PartitionWatchInterval is how often the topic is checked for new
	// partitions (which forces a rebalance).
	PartitionWatchInterval time.Duration
}

// WithDefaults returns c with its zero fields set.
func (c Config) WithDefaults() Config {
	if c.Topic == "" {
		c.Topic = "job-events"
	}
	if c.Group == "" {
		c.Group = "projector"
	}
	if c.Start == "" {
		c.Start = "earliest"
	}
	if c.BatchSize == 0 {
		c.BatchSize = 5000
	}
	if c.BatchLinger == 0 {
		c.BatchLinger = 50 * time.Millisecond
	}
	if c.MaxWait == 0 {
		c.MaxWait = time.Second
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	if c.CacheSize == 0 {
		c.CacheSize = 100_000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 3 * time.Second
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 30 * time.Second
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = 30 * time.Second
	}
	if c.JoinGroupBackoff == 0 {
		c.JoinGroupBackoff = 2 * time.Second
	}
	if c.PartitionWatchInterval == 0 {
		c.PartitionWatchInterval = 5 * time.Second
	}
	return c
}

// Validate reports every setting that cannot work, joined.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: at least one broker address (host:port) is required"))
	}
	for _, b := range c.Brokers {
		if b == "" || !strings.Contains(b, ":") {
			errs = append(errs, fmt.Errorf("brokers: %q is not a host:port address", b))
		}
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("topic: required"))
	}
	if c.Group == "" {
		errs = append(errs, errors.New("group: required"))
	}
	if c.Start != "earliest" && c.Start != "latest" {
		errs = append(errs, fmt.Errorf("start: %q is not earliest or latest", c.Start))
	}
	if c.BatchSize < 1 || c.BatchSize > 1_000_000 {
		errs = append(errs, fmt.Errorf("batch-size: %d is outside 1..1000000", c.BatchSize))
	}
	if c.BatchLinger < 0 {
		errs = append(errs, fmt.Errorf("batch-linger: %s is negative", c.BatchLinger))
	}
	if c.MaxWait < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("max-wait: %s is below 100ms", c.MaxWait))
	}
	if c.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("cache-size: %d is negative", c.CacheSize))
	}
	if c.Store == nil {
		errs = append(errs, errors.New("store: required"))
	}
	return errors.Join(errs...)
}
