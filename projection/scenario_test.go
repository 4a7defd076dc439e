package projection

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/store"
)

// scenarioDir holds the end-to-end scenarios; testdata/README.md describes
// their format.
const scenarioDir = "../testdata/scenarios"

// Timings of the scenario runner.
const (
	// awaitTimeout bounds an await step without "within".
	awaitTimeout = 20 * time.Second
	// expectGrace is how long an expect step lets the engine finish the
	// bookkeeping of what it already committed: counters and the status
	// follow a commit by a moment.
	expectGrace = 2 * time.Second
	// pollEvery is how often awaits and expects look again.
	pollEvery = 20 * time.Millisecond
	// A fetch from the authority gives up after scenarioSnapshotMaxElapsed
	// so a failing authority shows up in the held job's attempts quickly.
	scenarioSnapshotMaxElapsed = 300 * time.Millisecond
	scenarioSnapshotTimeout    = time.Second
)

// TestScenarios runs every testdata/scenarios/*.txt file as a parallel
// subtest against the real engine, the in-process broker and PostgreSQL.
// Adding a file adds a test case. PROJECTOR_SCENARIOS, a glob relative to
// this package, runs other files instead.
func TestScenarios(t *testing.T) {
	t.Parallel()
	pattern := filepath.Join(scenarioDir, "*.txt")
	if p := os.Getenv("PROJECTOR_SCENARIOS"); p != "" {
		pattern = p // e.g. ../testdata/scenarios/gap-*.txt
	}
	files, err := filepath.Glob(pattern)
	require.NoError(t, err)
	require.NotEmpty(t, files, "no scenario files match %s", pattern)
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			t.Parallel()
			sc, err := parseScenarioFile(file)
			if err != nil {
				t.Fatal(err)
			}
			sc.run(t)
		})
	}
}

// scenario is one parsed file.
type scenario struct {
	file       string
	partitions int
	gapWait    time.Duration
	reread     bool
	authority  bool
	steps      []scenarioStep
}

// scenarioStep is one line after the header. Exactly one of record, do and
// check is set.
type scenarioStep struct {
	pos    string // file:line
	text   string
	record *rec
	do     func(p *play, pos string)
	check  *scenarioCheck
}

// scenarioCheck is an await or an expect of one predicate.
type scenarioCheck struct {
	await  bool
	within time.Duration
	eval   func(*play) (bool, string)
}

// play is one run of a scenario.
type play struct {
	t       *testing.T
	sc      *scenario
	rig     *rig
	cfg     Config
	auth    *authority
	runs    []*running
	cur     *running
	pending []rec
}

func (sc *scenario) run(t *testing.T) {
	p := &play{t: t, sc: sc, rig: newRig(t, sc.partitions)}
	if sc.authority {
		p.auth = &authority{snaps: map[string][]byte{}, status: map[string]int{}}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /jobs/{id}", p.auth.serve)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		p.auth.url = srv.URL
	}
	p.cfg = p.rig.config(func(c *Config) {
		c.GapWait, c.GapWaitOff = sc.gapWait, false
		if sc.gapWait == 0 {
			c.GapWaitOff = true
		}
		c.NoReread = !sc.reread
		if sc.authority {
			c.SnapshotURL = p.auth.url
			c.SnapshotMaxElapsed = scenarioSnapshotMaxElapsed
			c.SnapshotTimeout = scenarioSnapshotTimeout
		}
	})
	t.Logf("scenario %s: %d partitions, gap-wait %s, reread %s, authority %s",
		sc.file, sc.partitions, sc.gapWait, onOff(sc.reread), onOff(sc.authority))

	for _, st := range sc.steps {
		if st.record != nil {
			p.pending = append(p.pending, *st.record)
			continue
		}
		p.flush()
		switch {
		case st.do != nil:
			t.Logf("%s: %s", st.pos, st.text)
			st.do(p, st.pos)
		case st.check != nil:
			p.verify(st)
		}
	}
	p.flush()
	if p.cur != nil {
		p.cur.halt(t)
		p.cur = nil
	}
	t.Logf("scenario %s: final counters over %d engine run(s): %s", filepath.Base(sc.file), len(p.runs), formatCounters(p.counters()))
}

// flush produces the records of consecutive record steps in one call;
// records of one partition keep their order.
func (p *play) flush() {
	if len(p.pending) == 0 {
		return
	}
	p.rig.produce(p.pending...)
	p.pending = nil
}

func (p *play) verify(st scenarioStep) {
	deadline := expectGrace
	if st.check.await {
		deadline = st.check.within
	}
	start := time.Now()
	var why string
	for {
		ok, w := st.check.eval(p)
		if ok {
			if st.check.await {
				p.t.Logf("%s: %s (after %s)", st.pos, st.text, time.Since(start).Round(time.Millisecond))
			}
			return
		}
		why = w
		if time.Since(start) > deadline {
			break
		}
		time.Sleep(pollEvery) // polling a condition with a deadline
	}
	p.dump()
	if st.check.await {
		p.t.Fatalf("%s: %s: still false after %s: %s", st.pos, st.text, deadline, why)
	}
	p.t.Fatalf("%s: %s: %s", st.pos, st.text, why)
}

// dump logs what the engine and the store hold, to explain a failure.
func (p *play) dump() {
	ctx := context.Background()
	p.t.Logf("counters over %d engine run(s): %s", len(p.runs), formatCounters(p.counters()))
	if p.cur != nil {
		st, _ := json.Marshal(p.cur.p.Status())
		p.t.Logf("engine status: %s", st)
	}
	if rows, err := p.rig.store.Jobs(ctx); err == nil {
		ids := make([]string, 0, len(rows))
		for id := range rows {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			p.t.Logf("row %s v=%d state=%s", id, rows[id].Version, rows[id].State)
		}
	}
	if held, _, err := p.rig.store.HeldJobs(ctx, 1000); err == nil {
		for _, h := range held {
			p.t.Logf("held %s partition %d versions=%v", h.JobID, h.Partition, h.Versions)
		}
	}
	if pos, err := p.rig.store.Positions(ctx); err == nil {
		for _, ps := range pos {
			p.t.Logf("position %d=%d (epoch %d)", ps.Partition, ps.NextOffset, ps.Epoch)
		}
	}
	if q, _, err := p.rig.store.Quarantine(ctx, 1000); err == nil {
		for _, r := range q {
			p.t.Logf("quarantine %d@%d: %s", r.Partition, r.Offset, r.Error)
		}
	}
}

func (p *play) start() {
	p.cur = p.rig.start(p.cfg)
	p.runs = append(p.runs, p.cur)
}

// counters sums the counters of every engine run of the scenario.
func (p *play) counters() map[string]int64 {
	sum := map[string]int64{}
	for _, r := range p.runs {
		for name, v := range counterFields(r.p.Status().Counters) {
			sum[name] += v
		}
	}
	return sum
}

// counterNames are the names a scenario may use for [Counters] fields, in
// the order they are reported.
var counterNames = []string{
	"applied", "deleted", "covered", "stale", "duplicates", "conflicts", "held", "quarantined",
	"closed_by_wait", "closed_by_reread", "closed_by_snapshot", "consumed", "batches", "fenced",
}

func counterFields(c Counters) map[string]int64 {
	return map[string]int64{
		"consumed": c.Consumed, "applied": c.Applied, "deleted": c.Deleted, "covered": c.Covered,
		"stale": c.Stale, "duplicates": c.Duplicates,
		"conflicts": c.Conflicts, "held": c.Held, "quarantined": c.Quarantined, "batches": c.Batches,
		"fenced": c.Fenced, "closed_by_wait": c.ClosedByWait, "closed_by_reread": c.ClosedByReread,
		"closed_by_snapshot": c.ClosedBySnapshot,
	}
}

func formatCounters(c map[string]int64) string {
	parts := make([]string, len(counterNames))
	for i, n := range counterNames {
		parts[i] = fmt.Sprintf("%s=%d", n, c[n])
	}
	return strings.Join(parts, " ")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// authority is the trusted snapshot endpoint of docs/contract.md section 3.
type authority struct {
	url   string
	mu    sync.Mutex
	down  bool
	snaps map[string][]byte
	// status is the answer's status when not 200 (410 Gone).
	status map[string]int
}

func (a *authority) serve(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.mu.Lock()
	down, snap, status := a.down, a.snaps[id], a.status[id]
	a.mu.Unlock()
	switch {
	case down:
		http.Error(w, "authority down (scenario)", http.StatusServiceUnavailable)
	case snap == nil:
		http.Error(w, "unknown job", http.StatusNotFound)
	default:
		w.Header().Set("Content-Type", "application/json")
		if status != 0 {
			w.WriteHeader(status)
		}
		_, _ = w.Write(snap)
	}
}

func (a *authority) set(f func(a *authority)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

// Parsing.

var (
	cmpRE  = regexp.MustCompile(`^([A-Za-z0-9_][A-Za-z0-9_-]*)(>=|<=|=|>|<)(-?[0-9]+)$`)
	atRE   = regexp.MustCompile(`^([0-9]+)@([0-9]+)$`)
	listRE = regexp.MustCompile(`^\[(-?[0-9]+(,-?[0-9]+)*)?\]$`)
)

// comparison is "name op number", e.g. applied>=2.
type comparison struct {
	name string
	op   string
	want int64
}

func parseComparison(tok string) (comparison, bool) {
	m := cmpRE.FindStringSubmatch(tok)
	if m == nil {
		return comparison{}, false
	}
	n, err := strconv.ParseInt(m[3], 10, 64)
	if err != nil {
		return comparison{}, false
	}
	return comparison{name: m[1], op: m[2], want: n}, true
}

func (c comparison) holds(have int64) bool {
	switch c.op {
	case "=":
		return have == c.want
	case ">=":
		return have >= c.want
	case "<=":
		return have <= c.want
	case ">":
		return have > c.want
	case "<":
		return have < c.want
	}
	return false
}

func (c comparison) String() string { return fmt.Sprintf("%s%s%d", c.name, c.op, c.want) }

func parseList(tok string) ([]int64, error) {
	if !listRE.MatchString(tok) {
		return nil, fmt.Errorf("%q is not a list of integers such as [3,4] or [] (no spaces)", tok)
	}
	out := []int64{}
	if err := json.Unmarshal([]byte(tok), &out); err != nil {
		return nil, err
	}
	return out, nil
}

// cut splits off the first space-separated word of s.
func cut(s string) (word, rest string) {
	s = strings.TrimSpace(s)
	i := strings.IndexAny(s, " \t")
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimSpace(s[i+1:])
}

// unquoteAll reads s as one Go string literal and nothing after it.
func unquoteAll(s string) (string, error) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil || q != s {
		return "", fmt.Errorf("%s is not one quoted string", s)
	}
	return strconv.Unquote(q)
}

func parseScenarioFile(file string) (*scenario, error) {
	body, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return parseScenario(file, string(body))
}

// parseScenario parses a scenario's text; errors start with file:line.
func parseScenario(file, body string) (*scenario, error) {
	sc := &scenario{file: file}
	seen := map[string]bool{}
	inHeader := true
	for i, line := range strings.Split(body, "\n") {
		pos := fmt.Sprintf("%s:%d", file, i+1)
		text := strings.TrimSpace(line)
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		word, rest := cut(text)
		if isHeaderWord(word, rest) {
			if !inHeader {
				return nil, fmt.Errorf("%s: %q is a header setting; settings go before the first step", pos, word)
			}
			if seen[word] {
				return nil, fmt.Errorf("%s: %q is set twice", pos, word)
			}
			seen[word] = true
			if err := sc.setHeader(word, rest); err != nil {
				return nil, fmt.Errorf("%s: %w", pos, err)
			}
			continue
		}
		if inHeader {
			inHeader = false
			if !seen["partitions"] {
				return nil, fmt.Errorf("%s: the header must say how many partitions the topic has (partitions <n>)", pos)
			}
		}
		st, err := sc.parseStep(word, rest, i+1)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pos, err)
		}
		st.pos, st.text = fmt.Sprintf("%s:%d", filepath.Base(file), i+1), text
		sc.steps = append(sc.steps, st)
	}
	if len(sc.steps) == 0 {
		return nil, fmt.Errorf("%s: no steps", file)
	}
	return sc, nil
}

// isHeaderWord tells header settings from steps; "authority on|off" is the
// setting, any other authority line a step.
func isHeaderWord(w, rest string) bool {
	switch w {
	case "partitions", "gap-wait", "reread":
		return true
	case "authority":
		return rest == "on" || rest == "off"
	}
	return false
}

func (sc *scenario) setHeader(word, rest string) error {
	switch word {
	case "partitions":
		n, err := strconv.Atoi(rest)
		if err != nil || n < 1 || n > 64 {
			return fmt.Errorf("partitions %q: want a count from 1 to 64", rest)
		}
		sc.partitions = n
	case "gap-wait":
		d, err := time.ParseDuration(rest)
		if err != nil || d < 0 {
			return fmt.Errorf("gap-wait %q: want a duration such as 0, 500ms or 30s", rest)
		}
		sc.gapWait = d
	case "reread", "authority":
		var on bool
		switch rest {
		case "on":
			on = true
		case "off":
		default:
			return fmt.Errorf("%s %q: want on or off", word, rest)
		}
		if word == "reread" {
			sc.reread = on
		} else {
			sc.authority = on
		}
	}
	return nil
}

func (sc *scenario) parseStep(word, rest string, line int) (scenarioStep, error) {
	noArgs := func(do func(*play, string)) (scenarioStep, error) {
		if rest != "" {
			return scenarioStep{}, fmt.Errorf("%s takes no arguments", word)
		}
		return scenarioStep{do: do}, nil
	}
	switch word {
	case "produce", "snapshot", "delta", "delete":
		r, err := parseRecord(word, rest, line)
		return scenarioStep{record: r}, err
	case "authority":
		return sc.parseAuthority(rest, line)
	case "start":
		return noArgs(func(p *play, pos string) {
			if p.cur != nil {
				p.t.Fatalf("%s: start: the engine is already running", pos)
			}
			p.start()
		})
	case "restart":
		return noArgs(func(p *play, pos string) {
			if p.cur == nil {
				p.t.Fatalf("%s: restart: the engine is not running", pos)
			}
			p.cur.halt(p.t)
			p.start()
		})
	case "stop":
		return noArgs(func(p *play, pos string) {
			if p.cur == nil {
				p.t.Fatalf("%s: stop: the engine is not running", pos)
			}
			p.cur.halt(p.t)
			p.cur = nil
		})
	case "await":
		within := awaitTimeout
		if i := strings.LastIndex(rest, " within "); i >= 0 {
			d, err := time.ParseDuration(strings.TrimSpace(rest[i+len(" within "):]))
			if err != nil || d <= 0 {
				return scenarioStep{}, fmt.Errorf("await: within %q: want a duration such as 5s", rest[i+len(" within "):])
			}
			within, rest = d, strings.TrimSpace(rest[:i])
		}
		eval, err := parsePredicate(rest)
		if err != nil {
			return scenarioStep{}, fmt.Errorf("await: %w", err)
		}
		return scenarioStep{check: &scenarioCheck{await: true, within: within, eval: eval}}, nil
	case "expect":
		eval, err := parsePredicate(rest)
		if err != nil {
			return scenarioStep{}, fmt.Errorf("expect: %w", err)
		}
		return scenarioStep{check: &scenarioCheck{eval: eval}}, nil
	}
	return scenarioStep{}, fmt.Errorf("unknown step %q (want produce, snapshot, delta, authority, start, restart, stop, await or expect)", word)
}

// parseRecord reads "produce <p> <key> <value>", "snapshot <p> <job> <v>
// <state>" or "delta <p> <job> <v> <ops>".
func parseRecord(word, rest string, line int) (*rec, error) {
	ptok, rest := cut(rest)
	part, err := strconv.Atoi(ptok)
	if err != nil || part < 0 {
		return nil, fmt.Errorf("%s: partition %q is not a partition number", word, ptok)
	}
	if word == "produce" {
		ktok, rest := cut(rest)
		key := ktok
		switch {
		case ktok == "":
			return nil, errors.New("produce: want produce <partition> <key> <value>")
		case ktok == "-":
			key = ""
		case strings.HasPrefix(ktok, `"`):
			if key, err = unquoteAll(ktok); err != nil {
				return nil, fmt.Errorf("produce: key: %w", err)
			}
		}
		value, err := parseValue(rest)
		if err != nil {
			return nil, fmt.Errorf("produce: value: %w", err)
		}
		return &rec{partition: part, key: key, value: value}, nil
	}
	job, rest := cut(rest)
	vtok, body := cut(rest)
	v, err := strconv.ParseInt(vtok, 10, 64)
	jobJSON, _ := json.Marshal(job)
	// The event id names the scenario line, so a log line leads back to it.
	eventID := fmt.Sprintf("evt-%d-L%d", v, line)
	if word == "delete" {
		if job == "" || err != nil || body != "" {
			return nil, errors.New("delete: want delete <partition> <job> <version>")
		}
		value := fmt.Sprintf(`{"job_id":%s,"version":%d,"kind":"delete","event_id":"%s"}`, jobJSON, v, eventID)
		return &rec{partition: part, key: job, value: []byte(value)}, nil
	}
	if job == "" || err != nil || body == "" {
		return nil, fmt.Errorf("%s: want %s <partition> <job> <version> <json>", word, word)
	}
	var value string
	if word == "snapshot" {
		if !json.Valid([]byte(body)) || body[0] != '{' {
			return nil, fmt.Errorf("snapshot: the state %s is not a JSON object on one line", body)
		}
		value = fmt.Sprintf(`{"job_id":%s,"version":%d,"kind":"snapshot","state":%s,"event_id":"%s"}`, jobJSON, v, body, eventID)
	} else {
		if !json.Valid([]byte(body)) || body[0] != '[' {
			return nil, fmt.Errorf("delta: the ops %s are not a JSON array on one line", body)
		}
		value = fmt.Sprintf(`{"job_id":%s,"version":%d,"kind":"delta","ops":%s,"event_id":"%s"}`, jobJSON, v, body, eventID)
	}
	return &rec{partition: part, key: job, value: []byte(value)}, nil
}

// parseValue reads a record value: empty, tombstone, hex:<digits>, a Go
// quoted string, or the bytes as written.
func parseValue(s string) ([]byte, error) {
	switch {
	case s == "":
		return nil, errors.New(`missing (write "empty" for a zero-length value, "tombstone" for a null one)`)
	case s == "empty":
		return []byte{}, nil
	case s == "tombstone":
		return []byte(nil), nil
	case strings.HasPrefix(s, "hex:"):
		b, err := hex.DecodeString(strings.ReplaceAll(s[len("hex:"):], " ", ""))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
		return b, nil
	case strings.HasPrefix(s, `"`):
		u, err := unquoteAll(s)
		if err != nil {
			return nil, err
		}
		return []byte(u), nil
	}
	return []byte(s), nil
}

func (sc *scenario) parseAuthority(rest string, line int) (scenarioStep, error) {
	if !sc.authority {
		return scenarioStep{}, errors.New(`authority steps need "authority on" in the header`)
	}
	switch rest {
	case "down", "up":
		down := rest == "down"
		return scenarioStep{do: func(p *play, _ string) { p.auth.set(func(a *authority) { a.down = down }) }}, nil
	}
	// authority <job> delete <version>: a 200 with a delete record;
	// authority <job> gone <version>: 410 Gone with the version.
	job, more := cut(rest)
	if how, vtok := cut(more); how == "delete" || how == "gone" {
		v, err := strconv.ParseInt(vtok, 10, 64)
		if err != nil || job == "" {
			return scenarioStep{}, fmt.Errorf("authority: want authority <job> %s <version>", how)
		}
		r, _ := parseRecord("delete", fmt.Sprintf("0 %s %d", job, v), line)
		value, status := r.value.([]byte), 0
		if how == "gone" {
			value, status = fmt.Appendf(nil, `{"version":%d}`, v), http.StatusGone
		}
		return scenarioStep{do: func(p *play, _ string) {
			p.auth.set(func(a *authority) { a.snaps[job], a.status[job] = value, status })
		}}, nil
	}
	r, err := parseRecord("snapshot", "0 "+rest, line)
	if err != nil {
		return scenarioStep{}, errors.New("authority: want authority down, authority up, authority <job> <version> <state>, authority <job> delete <version> or authority <job> gone <version>")
	}
	value := r.value.([]byte)
	return scenarioStep{do: func(p *play, _ string) {
		p.auth.set(func(a *authority) { a.snaps[job], a.status[job] = value, 0 })
	}}, nil
}

type predicate = func(*play) (bool, string)

// parsePredicate reads what an await waits for or an expect checks.
func parsePredicate(s string) (predicate, error) {
	word, rest := cut(s)
	if c, ok := parseComparison(word); ok && c.name == "held" && rest == "" {
		return heldCount(c), nil
	}
	switch word {
	case "caught-up":
		if rest != "" {
			return nil, errors.New("caught-up takes no arguments")
		}
		return caughtUpPredicate, nil
	case "row":
		return parseRowPredicate(rest)
	case "no-row":
		job, more := cut(rest)
		if job == "" || more != "" {
			return nil, errors.New("want no-row <job>")
		}
		return func(p *play) (bool, string) {
			rows := p.loadRows(job)
			if r, ok := rows[job]; ok {
				return false, fmt.Sprintf("job %s has a row at v%d: %s", job, r.Version, r.State)
			}
			return true, ""
		}, nil
	case "tombstone":
		return parseTombstonePredicate(rest)
	case "no-tombstone":
		job, more := cut(rest)
		if job == "" || more != "" {
			return nil, errors.New("want no-tombstone <job>")
		}
		return func(p *play) (bool, string) {
			ts, err := p.rig.store.Tombstones(context.Background(), []string{job})
			if err != nil {
				return false, err.Error()
			}
			if t, ok := ts[job]; ok {
				return false, fmt.Sprintf("job %s has a tombstone at v%d", job, t.Version)
			}
			return true, ""
		}, nil
	case "counters", "counter":
		return parseCountersPredicate(rest)
	case "quarantine":
		return parseQuarantinePredicate(rest)
	case "held":
		return parseHeldPredicate(rest)
	case "position":
		c, ok := parseComparison(rest)
		if !ok {
			return nil, errors.New("want position <partition>=<next offset>")
		}
		part, err := strconv.Atoi(c.name)
		if err != nil {
			return nil, fmt.Errorf("position: %q is not a partition number", c.name)
		}
		return positionPredicate(part, c), nil
	case "status":
		return parseStatusPredicate(rest)
	}
	return nil, fmt.Errorf("unknown condition %q (want caught-up, row, no-row, counters, quarantine, held, position or status)", word)
}

func caughtUpPredicate(p *play) (bool, string) {
	ctx := context.Background()
	hwm, err := p.rig.kafka.HighWatermarks(ctx, p.rig.topic)
	if err != nil {
		return false, err.Error()
	}
	pos, err := p.rig.store.Positions(ctx)
	if err != nil {
		return false, err.Error()
	}
	stored := map[int]int64{}
	for _, ps := range pos {
		if ps.Topic == p.rig.topic {
			stored[ps.Partition] = ps.NextOffset
		}
	}
	var engine map[int]int64
	if p.cur != nil {
		engine = map[int]int64{}
		for _, ps := range p.cur.p.Status().Partitions {
			engine[ps.Partition] = ps.Position
		}
	}
	for part := range p.sc.partitions {
		h := hwm[part]
		if h == 0 {
			continue
		}
		if stored[part] != h {
			return false, fmt.Sprintf("partition %d: stored position %d, high watermark %d", part, stored[part], h)
		}
		// The engine settles a batch (counters, cache, status) after its
		// commit: wait for that too, so what follows sees its counters.
		if engine != nil && engine[part] != h {
			return false, fmt.Sprintf("partition %d: committed to %d but the engine reports %d", part, h, engine[part])
		}
	}
	return true, ""
}

// loadRows reads the read-model table itself, as a reader does: a deleted
// job must not be there.
func (p *play) loadRows(ids ...string) map[string]store.Job {
	rows, err := p.rig.store.Pool().Query(context.Background(), `SELECT job_id, version, state::text
		FROM `+p.rig.store.JobsTable()+` WHERE job_id = ANY($1::text[])`, ids)
	if err != nil {
		p.t.Fatalf("load rows: %v", err)
	}
	defer rows.Close()
	out := map[string]store.Job{}
	for rows.Next() {
		var j store.Job
		var state string
		if err := rows.Scan(&j.ID, &j.Version, &state); err != nil {
			p.t.Fatalf("load rows: %v", err)
		}
		j.State = json.RawMessage(state)
		out[j.ID] = j
	}
	if err := rows.Err(); err != nil {
		p.t.Fatalf("load rows: %v", err)
	}
	return out
}

// parseTombstonePredicate reads "<job> v<op>N": the job's tombstone is at
// a version that compares.
func parseTombstonePredicate(s string) (predicate, error) {
	job, rest := cut(s)
	c, ok := parseComparison(rest)
	if job == "" || !ok || c.name != "v" {
		return nil, errors.New("want tombstone <job> v=<version>")
	}
	return func(p *play) (bool, string) {
		ts, err := p.rig.store.Tombstones(context.Background(), []string{job})
		if err != nil {
			return false, err.Error()
		}
		t, ok := ts[job]
		switch {
		case !ok:
			return false, fmt.Sprintf("job %s has no tombstone", job)
		case !c.holds(t.Version):
			return false, fmt.Sprintf("job %s has a tombstone at v%d, want %s", job, t.Version, c)
		}
		return true, ""
	}, nil
}

// parseRowPredicate reads "<job> [v<op>N] [state=<json>]"; state= takes the
// rest of the line.
func parseRowPredicate(s string) (predicate, error) {
	job, rest := cut(s)
	if job == "" {
		return nil, errors.New("want row <job> [v=<version>] [state=<json>]")
	}
	var ver *comparison
	var state json.RawMessage
	for rest != "" {
		if body, ok := strings.CutPrefix(rest, "state="); ok {
			if !json.Valid([]byte(body)) {
				return nil, fmt.Errorf("row %s: state=%s is not JSON on one line", job, body)
			}
			state = json.RawMessage(body)
			break
		}
		var tok string
		tok, rest = cut(rest)
		c, ok := parseComparison(tok)
		if !ok || c.name != "v" || ver != nil {
			return nil, fmt.Errorf("row %s: %q: want v=<version> then state=<json>", job, tok)
		}
		ver = &c
	}
	return func(p *play) (bool, string) {
		r, ok := p.loadRows(job)[job]
		if !ok {
			return false, fmt.Sprintf("job %s has no row", job)
		}
		if ver != nil && !ver.holds(r.Version) {
			return false, fmt.Sprintf("job %s is at v%d, want %s (state %s)", job, r.Version, ver, r.State)
		}
		if state != nil {
			same, err := sameJSONText(r.State, state)
			if err != nil {
				return false, err.Error()
			}
			if !same {
				return false, fmt.Sprintf("job %s v%d has state %s, want %s", job, r.Version, r.State, state)
			}
		}
		return true, ""
	}, nil
}

func parseCountersPredicate(s string) (predicate, error) {
	var want []comparison
	for _, tok := range strings.Fields(s) {
		c, ok := parseComparison(tok)
		if !ok || !slices.Contains(counterNames, c.name) {
			return nil, fmt.Errorf("counters: %q: want <name><op><n> with a name from %v", tok, counterNames)
		}
		want = append(want, c)
	}
	if len(want) == 0 {
		return nil, errors.New("counters: name at least one counter")
	}
	return func(p *play) (bool, string) {
		have := p.counters()
		var bad []string
		for _, c := range want {
			if !c.holds(have[c.name]) {
				bad = append(bad, fmt.Sprintf("%s is %d", c, have[c.name]))
			}
		}
		if len(bad) > 0 {
			return false, fmt.Sprintf("%s (all: %s)", strings.Join(bad, ", "), formatCounters(have))
		}
		return true, ""
	}, nil
}

func parseQuarantinePredicate(s string) (predicate, error) {
	first, rest := cut(s)
	if c, ok := parseComparison(first); ok && c.name == "count" && rest == "" {
		return func(p *play) (bool, string) {
			_, total, err := p.rig.store.Quarantine(context.Background(), 1)
			if err != nil {
				return false, err.Error()
			}
			if !c.holds(int64(total)) {
				return false, fmt.Sprintf("%d records in quarantine, want %s", total, c)
			}
			return true, ""
		}, nil
	}
	m := atRE.FindStringSubmatch(first)
	kw, quoted := cut(rest)
	if m == nil || kw != "contains" {
		return nil, errors.New(`want quarantine count=<n> or quarantine <partition>@<offset> contains "<text>"`)
	}
	sub, err := unquoteAll(quoted)
	if err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	part, _ := strconv.Atoi(m[1])
	off, _ := strconv.ParseInt(m[2], 10, 64)
	return func(p *play) (bool, string) {
		q, _, err := p.rig.store.Quarantine(context.Background(), 10000)
		if err != nil {
			return false, err.Error()
		}
		for _, r := range q {
			if r.Partition == part && r.Offset == off {
				if strings.Contains(r.Error, sub) {
					return true, ""
				}
				return false, fmt.Sprintf("record %d@%d is quarantined with %q, which does not contain %q", part, off, r.Error, sub)
			}
		}
		return false, fmt.Sprintf("record %d@%d is not in the quarantine (%d records there)", part, off, len(q))
	}, nil
}

// heldCount compares the number of jobs with held deltas in the store.
func heldCount(c comparison) predicate {
	return func(p *play) (bool, string) {
		held, total, err := p.rig.store.HeldJobs(context.Background(), 1000)
		if err != nil {
			return false, err.Error()
		}
		if !c.holds(int64(total)) {
			return false, fmt.Sprintf("%d jobs hold deltas in the store, want %s: %v", total, c, held)
		}
		return true, ""
	}
}

func parseHeldPredicate(s string) (predicate, error) {
	job, rest := cut(s)
	list, ok := strings.CutPrefix(rest, "versions=")
	if job == "" || !ok {
		return nil, errors.New("want held<op><n> or held <job> versions=[..]")
	}
	want, err := parseList(list)
	if err != nil {
		return nil, fmt.Errorf("held %s: %w", job, err)
	}
	return func(p *play) (bool, string) {
		held, _, err := p.rig.store.HeldJobs(context.Background(), 10000)
		if err != nil {
			return false, err.Error()
		}
		have := []int64{}
		for _, h := range held {
			if h.JobID == job {
				have = h.Versions
			}
		}
		if !slices.Equal(have, want) {
			return false, fmt.Sprintf("job %s holds versions %v in the store, want %v", job, have, want)
		}
		return true, ""
	}, nil
}

func positionPredicate(part int, c comparison) predicate {
	return func(p *play) (bool, string) {
		pos, err := p.rig.store.Positions(context.Background())
		if err != nil {
			return false, err.Error()
		}
		have := int64(-1)
		for _, ps := range pos {
			if ps.Topic == p.rig.topic && ps.Partition == part {
				have = ps.NextOffset
			}
		}
		if !c.holds(have) {
			return false, fmt.Sprintf("partition %d is stored at %d, want %s", part, have, c)
		}
		return true, ""
	}
}

// parseStatusPredicate reads "held-jobs<op>N" or "held <job> [fields]",
// checked against the running engine's [Projector.Status].
func parseStatusPredicate(s string) (predicate, error) {
	word, rest := cut(s)
	if c, ok := parseComparison(word); ok && c.name == "held-jobs" && rest == "" {
		return func(p *play) (bool, string) {
			if p.cur == nil {
				return false, "no engine is running"
			}
			n := p.cur.p.Status().Counters.HeldJobs
			if !c.holds(n) {
				return false, fmt.Sprintf("the engine reports %d held jobs, want %s", n, c)
			}
			return true, ""
		}, nil
	}
	if word != "held" {
		return nil, errors.New("want status held-jobs<op><n> or status held <job> [version<op>n] [attempts<op>n] [held-deltas<op>n] [missing=[..]] [step=<step>] [error contains \"<text>\"]")
	}
	job, rest := cut(rest)
	if job == "" {
		return nil, errors.New("status held: name the job")
	}
	var checks []func(HeldJob) string
	for rest != "" {
		var tok string
		tok, rest = cut(rest)
		if tok == "error" {
			kw, quoted := cut(rest)
			sub, err := unquoteAll(quoted)
			if kw != "contains" || err != nil {
				return nil, errors.New(`status held: want error contains "<text>" at the end`)
			}
			checks = append(checks, func(h HeldJob) string {
				if !strings.Contains(h.LastError, sub) {
					return fmt.Sprintf("last error %q does not contain %q", h.LastError, sub)
				}
				return ""
			})
			break
		}
		if list, ok := strings.CutPrefix(tok, "missing="); ok {
			want, err := parseList(list)
			if err != nil {
				return nil, fmt.Errorf("status held %s: %w", job, err)
			}
			checks = append(checks, func(h HeldJob) string {
				have := h.Missing
				if have == nil {
					have = []int64{}
				}
				if !slices.Equal(have, want) {
					return fmt.Sprintf("missing %v, want %v", have, want)
				}
				return ""
			})
			continue
		}
		if step, ok := strings.CutPrefix(tok, "step="); ok {
			checks = append(checks, func(h HeldJob) string {
				if h.LastStep != step {
					return fmt.Sprintf("last step %q, want %q", h.LastStep, step)
				}
				return ""
			})
			continue
		}
		c, ok := parseComparison(tok)
		if !ok {
			return nil, fmt.Errorf("status held %s: %q is not a field check", job, tok)
		}
		var field func(HeldJob) int64
		switch c.name {
		case "version":
			field = func(h HeldJob) int64 { return h.Version }
		case "attempts":
			field = func(h HeldJob) int64 { return int64(h.Attempts) }
		case "held-deltas":
			field = func(h HeldJob) int64 { return int64(h.HeldDeltas) }
		default:
			return nil, fmt.Errorf("status held %s: unknown field %q (want version, attempts, held-deltas, missing, step or error)", job, c.name)
		}
		checks = append(checks, func(h HeldJob) string {
			if v := field(h); !c.holds(v) {
				return fmt.Sprintf("%s is %d, want %s", c.name, v, c)
			}
			return ""
		})
	}
	return func(p *play) (bool, string) {
		if p.cur == nil {
			return false, "no engine is running"
		}
		for _, ps := range p.cur.p.Status().Partitions {
			for _, h := range ps.Held {
				if h.JobID != job {
					continue
				}
				for _, check := range checks {
					if why := check(h); why != "" {
						return false, fmt.Sprintf("held job %s: %s (%+v)", job, why, h)
					}
				}
				return true, ""
			}
		}
		return false, fmt.Sprintf("the engine does not report %s as held", job)
	}, nil
}

// sameJSONText compares two JSON texts as values; numbers are compared
// exactly, by value (5, 5.0 and 5e0 are equal; 2^53 and 2^53+1 are not),
// as delta.SameState does.
func sameJSONText(a, b []byte) (bool, error) {
	for _, t := range [][]byte{a, b} {
		if !json.Valid(t) {
			return false, fmt.Errorf("not valid JSON: %s", t)
		}
	}
	return delta.SameState(a, b), nil
}

// TestScenarioParseErrors checks that the format is strict: every mistake
// fails with the file and line.
func TestScenarioParseErrors(t *testing.T) {
	t.Parallel()
	const head = "partitions 1\n"
	for _, tc := range []struct {
		name, body, want string
	}{
		{"unknown step", head + "start\nfrobnicate job-1\n", "x.txt:3: unknown step \"frobnicate\""},
		{"unknown condition", head + "await sunrise\n", "x.txt:2: await: unknown condition \"sunrise\""},
		{"no partitions", "gap-wait 1s\nstart\n", "x.txt:2: the header must say how many partitions"},
		{"header after a step", head + "start\nreread on\n", "x.txt:3: \"reread\" is a header setting"},
		{"setting twice", head + "partitions 2\n", "x.txt:2: \"partitions\" is set twice"},
		{"bad on/off", head + "reread maybe\n", "x.txt:2: reread \"maybe\": want on or off"},
		{"authority step without authority", head + "authority down\n", "x.txt:2: authority steps need"},
		{"state not an object", head + "snapshot 0 job-1 1 [1]\n", "x.txt:2: snapshot: the state [1] is not a JSON object"},
		{"ops not JSON", head + "delta 0 job-1 2 [{\"op\":\n", "x.txt:2: delta: the ops"},
		{"bad hex", head + "produce 0 k hex:zz\n", "x.txt:2: produce: value: hex:zz"},
		{"missing value", head + "produce 0 k\n", "x.txt:2: produce: value: missing"},
		{"unknown counter", head + "expect counters applyed=1\n", "x.txt:2: expect: counters: \"applyed=1\""},
		{"bad list", head + "expect held job-1 versions=[3, 4]\n", "x.txt:2: expect: held job-1"},
		{"bad within", head + "await caught-up within soon\n", "x.txt:2: await: within \"soon\""},
		{"start with arguments", head + "start now\n", "x.txt:2: start takes no arguments"},
		{"row field", head + "expect row job-1 version=2\n", "x.txt:2: expect: row job-1: \"version=2\""},
		{"quarantine form", head + "expect quarantine 3 contains \"x\"\n", "x.txt:2: expect: want quarantine count="},
		{"status field", head + "expect status held job-1 colour=3\n", "x.txt:2: expect: status held job-1: unknown field \"colour\""},
		{"no steps", head + "# nothing\n", "x.txt: no steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseScenario("x.txt", tc.body)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}

	sc, err := parseScenario("x.txt", head+"authority on\nauthority job-1 2 {\"a\":1}\nproduce 0 - empty\nproduce 0 \"k\\x00\" \"v\\xff\"\n"+
		"produce 0 k tombstone\nstart\nawait status held job-1 attempts>=2 missing=[2] error contains \"503\" within 3s\nexpect counter applied=1\n")
	require.NoError(t, err)
	require.True(t, sc.authority)
	require.Len(t, sc.steps, 7)
	require.Equal(t, rec{partition: 0, key: "", value: []byte{}}, *sc.steps[1].record)
	require.Equal(t, rec{partition: 0, key: "k\x00", value: []byte("v\xff")}, *sc.steps[2].record)
	require.Nil(t, sc.steps[3].record.value.([]byte))
	require.Equal(t, 3*time.Second, sc.steps[5].check.within)
}
