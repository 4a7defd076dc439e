package projection

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/source/sqs/sqscfg"
)

// TestOffIsExplicitAndStaysOff: waiting, tombstone pruning and the SQS long
// poll are turned off by a field of their own, which defaults applied twice
// leave off; a duration given beside "off" is refused rather than one of
// them silently winning.
func TestOffIsExplicitAndStaysOff(t *testing.T) {
	t.Parallel()
	c := Config{GapWaitOff: true, TombstonesForever: true, SQS: sqscfg.Config{ShortPoll: true}}
	twice := c.WithDefaults().WithDefaults()
	require.Zero(t, twice.gapWait(), "gap waiting stays off")
	require.True(t, twice.TombstonesForever)
	require.Zero(t, twice.TombstoneRetention)
	require.Zero(t, twice.SQS.WithDefaults().Wait, "the long poll stays off")
	require.Equal(t, 10*time.Second, Config{}.WithDefaults().WithDefaults().gapWait(), "zero is the default, not off")

	err := Config{GapWaitOff: true, GapWait: time.Second}.WithDefaults().Validate()
	require.ErrorContains(t, err, "gap-wait: 1s given with GapWaitOff")
	err = Config{TombstonesForever: true, TombstoneRetention: time.Hour}.WithDefaults().Validate()
	require.ErrorContains(t, err, "tombstone-retention: 1h0m0s given with TombstonesForever")
	err = sqscfg.Config{QueueURL: "https://sqs.eu-west-1.amazonaws.com/1/q.fifo", ShortPoll: true, Wait: 5 * time.Second}.WithDefaults().Validate()
	require.ErrorContains(t, err, "sqs-wait 5s given with ShortPoll")
}
