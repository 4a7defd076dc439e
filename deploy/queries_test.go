package deploy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
)

const (
	referencePath = "../docs/reference/metrics.md"
	dashboardPath = "grafana/projector.json"
	rulesPath     = "prometheus/alerts.yaml"
	runbookPath   = "../docs/runbook.md"
)

// targetLabels are the labels Prometheus attaches to every series of a
// scrape target; the code does not export them.
var targetLabels = []string{"instance", "job"}

// scrapeSeries are the series Prometheus writes for every scrape target
// itself (up: 1 when the scrape answered); the code does not export them.
var scrapeSeries = map[string]bool{"up": true}

// promqlParser is the parser Prometheus evaluates rules with.
var promqlParser = parser.NewParser(parser.Options{})

// family is one row of the metric reference.
type family struct {
	typ    string
	labels map[string]bool
}

// readReference reads docs/reference/metrics.md's table.
func readReference(t *testing.T) map[string]family {
	t.Helper()
	b, err := os.ReadFile(referencePath)
	require.NoError(t, err)
	row := regexp.MustCompile("^\\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \\| (counter|gauge|histogram|summary|untyped) \\| ([^|]*) \\|")
	out := map[string]family{}
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		f := family{typ: m[2], labels: map[string]bool{}}
		for _, l := range strings.Fields(m[3]) {
			if l != "-" {
				f.labels[strings.Trim(l, "`")] = true
			}
		}
		out[m[1]] = f
	}
	require.NotEmpty(t, out, "no metric in %s", referencePath)
	for name := range scrapeSeries {
		out[name] = family{typ: "gauge", labels: map[string]bool{}}
	}
	return out
}

// seriesFamily is the family a series name belongs to: itself, or a
// histogram's or summary's _bucket, _sum or _count; ok false when none.
func seriesFamily(ref map[string]family, name string) (string, family, bool) {
	if f, ok := ref[name]; ok {
		return name, f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(name, suffix)
		if f, ok := ref[base]; found && ok && (f.typ == "histogram" || f.typ == "summary") {
			if suffix != "_bucket" || f.typ == "histogram" {
				return base, f, true
			}
		}
	}
	return "", family{}, false
}

// allowedLabels are the labels a series of name may carry.
func allowedLabels(ref map[string]family, name string) map[string]bool {
	base, f, _ := seriesFamily(ref, name)
	out := map[string]bool{}
	for l := range f.labels {
		out[l] = true
	}
	for _, l := range targetLabels {
		out[l] = true
	}
	switch {
	case f.typ == "histogram" && name != base+"_bucket":
		delete(out, "le")
	case f.typ == "summary" && name != base:
		delete(out, "quantile")
	}
	return out
}

// query is one PromQL expression of the dashboard or the rules, and
// where it is.
type query struct {
	where string
	expr  string
}

// grafanaVariables are Grafana's interval variables, replaced as Grafana
// replaces them before it sends a query.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// dashboardQueries are every panel's target expressions and the label_values
// queries of the dashboard's variables, the latter as their selector and
// label.
func dashboardQueries(t *testing.T) (exprs []query, variables []query, varLabels []string) {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" {
				require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
				require.NotEmpty(t, p.FieldConfig.Defaults.Unit, "panel %q has no unit", p.Title)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, query{where: fmt.Sprintf("panel %q %s", p.Title, tg.RefID), expr: grafanaVariables.Replace(tg.Expr)})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		require.NoError(t, json.Unmarshal(v.Query, &q), "variable %s", v.Name)
		m := labelValues.FindStringSubmatch(q.Query)
		require.NotNil(t, m, "variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		variables = append(variables, query{where: "variable " + v.Name, expr: m[1]})
		varLabels = append(varLabels, m[2])
	}
	return exprs, variables, varLabels
}

type panel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// loadRules loads the rule file as Prometheus does (unknown fields
// refused, every expression and template parsed).
func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesPath, false, model.UTF8Validation, promqlParser, slog.New(slog.DiscardHandler))
	require.Empty(t, errs, "%s does not load", rulesPath)
	require.NotEmpty(t, groups.Groups)
	return groups
}

// alerts are the rule file's alerting rules.
func alerts(t *testing.T) []rulefmt.Rule {
	t.Helper()
	var out []rulefmt.Rule
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

// checkExpr parses expr and checks every metric it selects, and every
// label it matches, groups or joins on, against the reference; it returns
// the families selected.
func checkExpr(t *testing.T, ref map[string]family, q query) []string {
	t.Helper()
	expr, err := promqlParser.ParseExpr(q.expr)
	require.NoError(t, err, "%s: %s", q.where, q.expr)
	var used []string
	var labelsUnder func(parser.Node) map[string]bool
	labelsUnder = func(n parser.Node) map[string]bool {
		out := map[string]bool{}
		parser.Inspect(n, func(c parser.Node, _ []parser.Node) error {
			if vs, ok := c.(*parser.VectorSelector); ok {
				for l := range allowedLabels(ref, selectorName(vs)) {
					out[l] = true
				}
			}
			return nil
		})
		return out
	}
	requireLabels := func(what string, names []string, have map[string]bool) {
		for _, l := range names {
			require.True(t, have[l], "%s: %s label %q is on none of the metrics it reads (%s)", q.where, what, l, q.expr)
		}
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			name := selectorName(n)
			require.NotEmpty(t, name, "%s: a selector without a metric name: %s", q.where, n)
			base, _, ok := seriesFamily(ref, name)
			require.True(t, ok, "%s: metric %s is not in %s", q.where, name, referencePath)
			used = append(used, base)
			allowed := allowedLabels(ref, name)
			for _, m := range n.LabelMatchers {
				if m.Name != labels.MetricName {
					require.True(t, allowed[m.Name], "%s: %s has no label %q (%s)", q.where, name, m.Name, q.expr)
				}
			}
		case *parser.Call:
			checkCall(t, ref, q, n)
		case *parser.AggregateExpr:
			if !n.Without {
				requireLabels("the aggregation's", n.Grouping, labelsUnder(n.Expr))
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil && vm.On {
				requireLabels("the left side's matching", vm.MatchingLabels, labelsUnder(n.LHS))
				requireLabels("the right side's matching", vm.MatchingLabels, labelsUnder(n.RHS))
			}
		}
		return nil
	})
	return used
}

// counterFunctions read a counter: over anything else (a gauge that goes
// down) they count every fall as a reset and make up an increase.
var counterFunctions = map[string]bool{"rate": true, "irate": true, "increase": true, "resets": true}

// checkCall checks that a function gets the type of metric it means:
// rate and the like a counter (or a histogram's or summary's _bucket,
// _sum and _count, which are counters), histogram_quantile a histogram's
// _bucket series with le kept by every aggregation between.
func checkCall(t *testing.T, ref map[string]family, q query, c *parser.Call) {
	t.Helper()
	switch {
	case counterFunctions[c.Func.Name]:
		parser.Inspect(c, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				name := selectorName(vs)
				base, f, _ := seriesFamily(ref, name)
				require.True(t, f.typ == "counter" || base != name && (f.typ == "histogram" || f.typ == "summary"),
					"%s: %s() over %s, a %s, not a counter (%s)", q.where, c.Func.Name, name, f.typ, q.expr)
			}
			return nil
		})
	case c.Func.Name == "histogram_quantile":
		parser.Inspect(c.Args[1], func(n parser.Node, _ []parser.Node) error {
			switch n := n.(type) {
			case *parser.VectorSelector:
				name := selectorName(n)
				base, f, _ := seriesFamily(ref, name)
				require.True(t, f.typ == "histogram" && name == base+"_bucket",
					"%s: histogram_quantile over %s, not a histogram's _bucket series (%s)", q.where, name, q.expr)
			case *parser.AggregateExpr:
				keeps := slices.Contains(n.Grouping, "le") != n.Without
				require.True(t, keeps, "%s: histogram_quantile over an aggregation that drops le (%s)", q.where, q.expr)
			}
			return nil
		})
	}
}

func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// usedFamilies are the families the dashboard and the rules read, checked
// against the reference on the way.
func usedFamilies(t *testing.T, ref map[string]family) map[string]bool {
	t.Helper()
	exprs, vars, varLabels := dashboardQueries(t)
	for _, a := range alerts(t) {
		exprs = append(exprs, query{where: "alert " + a.Alert, expr: a.Expr})
	}
	used := map[string]bool{}
	for _, q := range exprs {
		for _, f := range checkExpr(t, ref, q) {
			used[f] = true
		}
	}
	for i, q := range vars {
		fams := checkExpr(t, ref, q)
		require.Len(t, fams, 1, "%s", q.where)
		require.True(t, allowedLabels(ref, fams[0])[varLabels[i]], "%s: %s has no label %q", q.where, fams[0], varLabels[i])
		used[fams[0]] = true
	}
	return used
}

// TestQueriesUseReferencedMetrics: every query of the dashboard (panels
// and variables) and of the alert rules parses with Prometheus's PromQL
// parser, and every metric it selects and every label it matches, groups
// or joins on is in the generated metric reference.
func TestQueriesUseReferencedMetrics(t *testing.T) {
	t.Parallel()
	ref := readReference(t)
	used := usedFamilies(t, ref)
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("the dashboard and the rules read %d families: %s", len(names), strings.Join(names, " "))
	// The concerns the dashboard must cover, by a metric each.
	for _, f := range []string{"projector_records_total", "projector_partition_lag", "projector_partition_position",
		"projector_batch_duration_seconds", "projector_held_jobs", "projector_oldest_held_seconds",
		"projector_gaps_opened_total", "projector_gaps_closed_total", "projector_authority_requests_total",
		"projector_authority_requests_in_flight", "projector_database_errors_total", "projector_stalls_total",
		"projector_ready", "process_resident_memory_bytes", "go_goroutines", "projector_info"} {
		require.True(t, used[f], "the dashboard and the rules do not read %s", f)
	}
}

// TestAlertRulesLoadWithRunbook: the rule file loads as Prometheus loads
// it; every alert has a summary, a description and a runbook_url that
// points at a section of docs/runbook.md that exists, and every runbook
// section is an alert's.
func TestAlertRulesLoadWithRunbook(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(runbookPath)
	require.NoError(t, err)
	sections := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			sections[anchor(h)] = h
		}
	}
	linked := map[string]bool{}
	for _, a := range alerts(t) {
		require.NotEmpty(t, a.Annotations["summary"], "alert %s: no summary", a.Alert)
		require.NotEmpty(t, a.Annotations["description"], "alert %s: no description", a.Alert)
		u := a.Annotations["runbook_url"]
		path, frag, ok := strings.Cut(u, "#")
		require.True(t, ok && path == "docs/runbook.md", "alert %s: runbook_url %q is not docs/runbook.md#section", a.Alert, u)
		require.Contains(t, sections, frag, "alert %s: docs/runbook.md has no section #%s", a.Alert, frag)
		require.Equal(t, a.Alert, sections[frag], "alert %s links the runbook section of another", a.Alert)
		linked[frag] = true
	}
	for frag, h := range sections {
		require.True(t, linked[frag], "runbook section %q is no alert's", h)
	}
}

// anchor is the fragment a Markdown renderer (GitHub's, GitLab's) gives
// a heading: lower case, spaces to hyphens, punctuation dropped.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDashboardFollowsProjection: the metrics carry no projection, so the
// dashboard shows one through the instances projector_info names for it:
// every selector of every panel keeps to instance=~"$instance", and the
// instance variable's All stands for the listed instances (no allValue
// such as .*, which would match every instance of every projection and
// make the schema and projection choice mean nothing).
func TestDashboardFollowsProjection(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var d struct {
		Templating struct {
			List []struct {
				Name       string  `json:"name"`
				IncludeAll bool    `json:"includeAll"`
				AllValue   *string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	found := false
	for _, v := range d.Templating.List {
		if v.Name != "instance" {
			continue
		}
		found = true
		require.True(t, v.IncludeAll, "the instance variable offers no All")
		if v.AllValue != nil {
			require.Empty(t, *v.AllValue, "the instance variable's All is not the projection's instances")
		}
	}
	require.True(t, found, "the dashboard has no instance variable")
	exprs, _, _ := dashboardQueries(t)
	for _, q := range exprs {
		expr, err := promqlParser.ParseExpr(q.expr)
		require.NoError(t, err, "%s", q.where)
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				kept := false
				for _, m := range vs.LabelMatchers {
					kept = kept || m.Name == "instance" && m.Type == labels.MatchRegexp && m.Value == "$instance"
				}
				require.True(t, kept, "%s: %s does not keep to instance=~\"$instance\"", q.where, vs)
			}
			return nil
		})
	}
}
