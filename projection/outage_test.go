package projection

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestQuarantineLogged: each quarantined record is logged with its
// partition, offset and reason, at most 10 per 10 s.
func TestQuarantineLogged(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	logs := &logLines{t: t}
	run := r.start(r.config(func(c *Config) { c.Logger = logs.logger() }))
	var recs []rec
	for i := range 25 {
		recs = append(recs, rec{0, fmt.Sprintf("k%d", i), "not json"})
	}
	r.produce(recs...)
	r.caughtUp(20*time.Second, run)
	lines := logs.matching("record quarantined")
	require.NotEmpty(t, lines)
	require.LessOrEqual(t, len(lines), 10, "rate-limited")
	require.Contains(t, lines[0], "partition=0")
	require.Contains(t, lines[0], "offset=0")
	require.Contains(t, lines[0], "reason=")
	require.Equal(t, int64(25), run.p.Status().Counters.Quarantined)
}

// TestKafkaOutageLogged: while the broker refuses offset lookups, the
// outage is logged once at its start (not once per failed poll), the lag
// it cannot refresh stays what it was, and its end is logged once.
func TestKafkaOutageLogged(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1)
	logs := &logLines{t: t}
	run := r.start(r.config(func(c *Config) { c.Logger = logs.logger() }))
	r.produce(rec{0, "a", snap("a", 1, `{}`)})
	r.caughtUp(20*time.Second, run)

	var down atomic.Bool
	down.Store(true)
	r.kafka.Kfake().ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		r.kafka.Kfake().KeepControl()
		if down.Load() {
			return nil, errors.New("broker outage (test)"), true
		}
		return nil, nil, false
	})
	r.eventually(20*time.Second, "the outage's start is logged", func() (bool, string) {
		return len(logs.matching("Kafka is failing; retrying", "attempt=1", "next_retry=")) == 1, ""
	})
	r.eventually(20*time.Second, "a second failed poll", func() (bool, string) {
		return run.p.sourceOutage.AttemptsSoFar() >= 2, ""
	})
	require.Len(t, logs.matching("Kafka is failing; retrying"), 1, "logged at its start, then at most every 30 s")
	down.Store(false)
	r.eventually(20*time.Second, "the outage's end is logged", func() (bool, string) {
		return len(logs.matching("Kafka answers again", "failed_for=")) == 1, ""
	})
}
