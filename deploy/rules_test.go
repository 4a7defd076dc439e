package deploy

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"github.com/stretchr/testify/require"
)

// TestAlertRulesOverTime evaluates alerts of the rule file every minute
// over series written in promqltest's load notation (one sample a minute),
// as Prometheus's rule manager would, so that the windows and for:
// durations count: each case names the alert, the series and the alerts
// (by their partition or instance label) that fire at some minute, none
// for a history that must page no one.
func TestAlertRulesOverTime(t *testing.T) {
	t.Parallel()
	const target = `instance="i-1", job="projector"`
	info := `projector_info{` + target + `, schema="public", table="jobs", topic="t", group="g"}`
	for _, c := range []struct {
		name, alert, series string
		minutes             int
		firing              []string
	}{
		{
			name: "a live heap at 85% of the memory limit for 17 minutes", alert: "ProjectorMemoryNearLimit", minutes: 17,
			series: `go_gc_heap_live_bytes{` + target + `} 170000000+0x17
				go_gc_gomemlimit_bytes{` + target + `} 200000000+0x17
				` + info + ` 1+0x17`,
			firing: []string{"i-1"},
		},
		{
			name: "a live heap at 85% of the limit for 13 minutes, then 50%", alert: "ProjectorMemoryNearLimit", minutes: 30,
			series: `go_gc_heap_live_bytes{` + target + `} 170000000+0x13 100000000+0x17
				go_gc_gomemlimit_bytes{` + target + `} 200000000+0x30
				` + info + ` 1+0x30`,
		},
		{
			name: "a live heap at 75% of the limit for 30 minutes", alert: "ProjectorMemoryNearLimit", minutes: 30,
			series: `go_gc_heap_live_bytes{` + target + `} 150000000+0x30
				go_gc_gomemlimit_bytes{` + target + `} 200000000+0x30
				` + info + ` 1+0x30`,
		},
		{
			name: "a live heap of 2^63 bytes and no memory limit", alert: "ProjectorMemoryNearLimit", minutes: 30,
			series: `go_gc_heap_live_bytes{` + target + `} 9223372036854775807+0x30
				go_gc_gomemlimit_bytes{` + target + `} 9223372036854775807+0x30
				` + info + ` 1+0x30`,
		},
		{
			name: "a memory limit of 0", alert: "ProjectorMemoryNearLimit", minutes: 30,
			series: `go_gc_heap_live_bytes{` + target + `} 150000000+0x30
				go_gc_gomemlimit_bytes{` + target + `} 0+0x30
				` + info + ` 1+0x30`,
		},
		{
			name: "Prometheus itself near its own limit", alert: "ProjectorMemoryNearLimit", minutes: 30,
			series: `go_gc_heap_live_bytes{instance="prometheus:9090", job="prometheus"} 180000000+0x30
				go_gc_gomemlimit_bytes{instance="prometheus:9090", job="prometheus"} 200000000+0x30
				` + info + ` 1+0x30`,
		},
		{
			name: "one database error pages no one", alert: "ProjectorDatabaseErrors", minutes: 40,
			series: `projector_database_errors_total{` + target + `} 0 0 1+0x40`,
		},
		{
			name: "database errors every minute for 20 minutes", alert: "ProjectorDatabaseErrors", minutes: 20,
			series: `projector_database_errors_total{` + target + `} 0+3x20`,
			firing: []string{"i-1"},
		},
		{
			name: "a stuck partition beside one that commits", alert: "ProjectorNoProgress", minutes: 30,
			series: `projector_partition_lag{` + target + `, partition="0"} 5+0x30
				projector_partition_position{` + target + `, partition="0"} 100+10x30
				projector_partition_lag{` + target + `, partition="1"} 5+0x30
				projector_partition_position{` + target + `, partition="1"} 100+0x30
				projector_partition_lag{` + target + `, partition="2"} 0+0x30
				projector_partition_position{` + target + `, partition="2"} 100+0x30
				projector_batches_total{` + target + `} 0+10x30`,
			firing: []string{"1"},
		},
		{
			name: "a partition that pauses 12 minutes and catches up", alert: "ProjectorNoProgress", minutes: 36,
			series: `projector_partition_lag{` + target + `, partition="0"} 5+0x27 0+0x8
				projector_partition_position{` + target + `, partition="0"} 100+1x15 115+0x11 120+0x8`,
		},
		{
			name: "lag that grows for 20 minutes", alert: "ProjectorLagGrowing", minutes: 25,
			series: `projector_partition_lag{` + target + `, partition="3"} 0+10x25
				projector_partition_lag{` + target + `, partition="4"} 50+0x25`,
			firing: []string{"3"},
		},
		{
			name: "one failed request to the authority", alert: "ProjectorAuthorityFailing", minutes: 40,
			series: `projector_authority_requests_total{` + target + `, result="ok"} 0+0x40
				projector_authority_requests_total{` + target + `, result="error"} 0 0 1+0x38`,
		},
		{
			name: "an authority down for 20 minutes", alert: "ProjectorAuthorityFailing", minutes: 40,
			series: `projector_authority_requests_total{` + target + `, result="ok"} 0+1x10 10+0x30
				projector_authority_requests_total{` + target + `, result="error"} 0+0x10 0+1x20 20+0x10`,
			firing: []string{"i-1"},
		},
		{
			name: "a restart loop", alert: "ProjectorStalled", minutes: 30,
			series: `process_start_time_seconds{` + target + `} 100+0x5 400+0x5 700+0x5 1000+0x15
				` + info + ` 1+0x30`,
			firing: []string{"i-1"},
		},
		{
			name: "one restart", alert: "ProjectorStalled", minutes: 30,
			series: `process_start_time_seconds{` + target + `} 100+0x5 400+0x25
				` + info + ` 1+0x30`,
		},
		{
			name: "an instance that stops answering", alert: "ProjectorDown", minutes: 20,
			series: `up{` + target + `} 1+0x10 0+0x10
				` + info + ` 1+0x10
				up{instance="other:9100", job="node"} 0+0x20`,
			firing: []string{"i-1"},
		},
		{
			name: "one failed scrape", alert: "ProjectorDown", minutes: 20,
			series: `up{` + target + `} 1+0x10 0 1+0x9
				` + info + ` 1+0x10 _ 1+0x9`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st := promqltest.LoadedStorage(t, "load 1m\n"+indent(c.series))
			engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
			t.Cleanup(func() { _ = engine.Close() })
			var rule *rules.AlertingRule
			for _, a := range alerts(t) {
				if a.Alert == c.alert {
					rule = newRule(t, a)
				}
			}
			require.NotNil(t, rule, "no alert %s in %s", c.alert, rulesPath)
			query := rules.EngineQueryFunc(engine, st)
			// Who fired at any minute: an alert that fires and resolves
			// before the end still paged someone.
			fired := map[string]bool{}
			for m := 0; m <= c.minutes; m++ {
				_, err := rule.Eval(context.Background(), 0, time.Unix(0, 0).Add(time.Duration(m)*time.Minute), query, nil, 0)
				require.NoError(t, err)
				for _, al := range rule.ActiveAlerts() {
					if al.State != rules.StateFiring {
						continue
					}
					who := al.Labels.Get("partition")
					if who == "" {
						who = al.Labels.Get("instance")
					}
					fired[who] = true
				}
			}
			var firing []string
			for who := range fired {
				firing = append(firing, who)
			}
			sort.Strings(firing)
			want := c.firing
			if want == nil {
				want = []string{}
			}
			if firing == nil {
				firing = []string{}
			}
			require.Equal(t, want, firing, "%s after %d minutes of\n%s", c.alert, c.minutes, c.series)
		})
	}
}

func indent(series string) string {
	var b strings.Builder
	for _, l := range strings.Split(series, "\n") {
		fmt.Fprintf(&b, "  %s\n", strings.TrimSpace(l))
	}
	return b.String()
}
