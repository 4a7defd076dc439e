package projection

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// Projector.Run must have waited for what it started (workers, committer,
// resolvers, kafka-go readers and group) before returning.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// internal/pgtest keeps one pool per test binary, shared by every
		// test and never closed (it has no hook at binary exit), so the
		// pool's own health-check loop is still running when the tests end.
		// It belongs to the pool, not to the engine: the engine never
		// opens a pool, it uses the Store it is given.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}
