package observe

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSamplerShowsBurstThenCounts(t *testing.T) {
	t.Parallel()
	s := Sampler{Window: 10 * time.Second, Burst: 2}
	t0 := time.Unix(1000, 0)
	ok, held := s.Allow(t0)
	require.True(t, ok)
	require.Zero(t, held)
	ok, _ = s.Allow(t0)
	require.True(t, ok)
	for range 5 {
		ok, _ = s.Allow(t0.Add(time.Second))
		require.False(t, ok)
	}
	require.Zero(t, s.Flush(t0.Add(5*time.Second)), "the window has not ended")
	// The next line shown after the window carries the count.
	ok, held = s.Allow(t0.Add(11 * time.Second))
	require.True(t, ok)
	require.Equal(t, 5, held)
	ok, _ = s.Allow(t0.Add(11 * time.Second))
	require.True(t, ok)
	ok, _ = s.Allow(t0.Add(12 * time.Second))
	require.False(t, ok)
	require.Equal(t, 1, s.Flush(t0.Add(22*time.Second)))
	require.Zero(t, s.Flush(t0.Add(23*time.Second)))
}
