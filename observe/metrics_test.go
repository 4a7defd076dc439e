package observe

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestEveryFamilyGathered: the reference's registry gathers every family
// of the engine's collector, with its labels, beside the build's.
func TestEveryFamilyGathered(t *testing.T) {
	t.Parallel()
	m := NewMetrics(prometheus.NewRegistry(), EveryFamily{}, "v1", "r1", "go1")
	mfs, err := m.Registry().Gather()
	require.NoError(t, err)
	byName := map[string][]string{}
	for _, mf := range mfs {
		var labels []string
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		byName[mf.GetName()] = labels
	}
	for _, f := range families {
		_, ok := byName[f.name]
		require.True(t, ok, "%s not gathered", f.name)
	}
	require.Equal(t, []string{"group=", "schema=", "table=", "topic="}, byName["projector_info"])
	require.Equal(t, []string{"goversion=go1", "revision=r1", "version=v1"}, byName["projector_build_info"])
}
