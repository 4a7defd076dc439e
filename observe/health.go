package observe

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/projector/projector/source"
)

// DatabaseFresh is how recent PostgreSQL's last answer (a commit, a
// claim, or the background ping) must be for the instance to be ready.
const DatabaseFresh = 5 * time.Second

// Check is one condition of readiness or liveness ([source.Check]).
type Check = source.Check

// Health is what /healthz and /readyz serve: OK and, check by check, why.
type Health struct {
	OK     bool    `json:"ok"`
	Checks []Check `json:"checks"`
}

// HealthOf is OK when every check is.
func HealthOf(checks []Check) Health {
	h := Health{OK: true, Checks: checks}
	for _, c := range checks {
		h.OK = h.OK && c.OK
	}
	return h
}

// Loops are the loops of an instance that /healthz watches: each beats,
// and one silent for too long is wedged.
type Loops struct {
	mu    sync.Mutex
	loops map[*Beat]string
}

// Beat is a loop's sign of life. floor is the longest silence the loop
// keeps by design (its own wait and bound per turn): a loop is wedged only
// when silent for longer than both floor and the stall timeout, so a short
// stall timeout does not make a monitor that turns every few seconds
// look wedged between two turns.
type Beat struct {
	at    atomic.Int64
	floor time.Duration
}

// Now records a sign of life.
func (b *Beat) Now() { b.at.Store(time.Now().UnixNano()) }

// Loop registers a loop under name; it is alive while it beats at least
// once per stall timeout, or per floor when that is longer. done removes it.
func (l *Loops) Loop(name string, floor time.Duration) (b *Beat, done func()) {
	b = &Beat{floor: floor}
	b.Now()
	l.mu.Lock()
	if l.loops == nil {
		l.loops = map[*Beat]string{}
	}
	l.loops[b] = name
	l.mu.Unlock()
	return b, func() {
		l.mu.Lock()
		delete(l.loops, b)
		l.mu.Unlock()
	}
}

// Checks is one check per loop at now: alive unless silent for longer
// than stallTimeout and its floor.
func (l *Loops) Checks(now time.Time, stallTimeout time.Duration) []Check {
	l.mu.Lock()
	defer l.mu.Unlock()
	checks := make([]Check, 0, len(l.loops)+1)
	for b, name := range l.loops {
		ago := now.Sub(time.Unix(0, b.at.Load()))
		limit := max(stallTimeout, b.floor)
		c := Check{Name: name, OK: ago <= limit, Detail: fmt.Sprintf("last sign of life %s ago", ago.Round(time.Millisecond))}
		if !c.OK {
			c.Detail = fmt.Sprintf("wedged: no sign of life for %s (stall timeout %s)", ago.Round(time.Second), limit)
		}
		checks = append(checks, c)
	}
	return checks
}

// Liveness is the loops' checks and the others given, by name.
func Liveness(checks ...Check) Health {
	sort.Slice(checks, func(i, j int) bool { return checks[i].Name < checks[j].Name })
	return HealthOf(checks)
}

// Database is when PostgreSQL last answered, for readiness.
type Database struct {
	// at is when PostgreSQL last answered (unix nanoseconds); err the
	// last failure since.
	at  atomic.Int64
	err atomic.Pointer[string]
}

// Answered records an answer from PostgreSQL.
func (d *Database) Answered() {
	d.at.Store(time.Now().UnixNano())
	d.err.Store(nil)
}

// Failed records a failed PostgreSQL operation.
func (d *Database) Failed(err error) {
	s := err.Error()
	d.err.Store(&s)
}

// Check is readiness's database check: PostgreSQL answered within
// DatabaseFresh.
func (d *Database) Check() Check {
	db := Check{Name: "database"}
	if at := d.at.Load(); at == 0 {
		db.Detail = "PostgreSQL has not answered yet"
	} else {
		ago := time.Since(time.Unix(0, at))
		db.OK = ago <= DatabaseFresh
		db.Detail = fmt.Sprintf("PostgreSQL answered %s ago", ago.Round(time.Millisecond))
		if !db.OK {
			db.Detail = fmt.Sprintf("PostgreSQL has not answered for %s", ago.Round(time.Second))
		}
	}
	if e := d.err.Load(); e != nil && !db.OK {
		db.Detail += ": " + *e
	}
	return db
}
