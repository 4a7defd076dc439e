package projection

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// Projector.Run must have waited for what it started (workers, committer,
// resolvers, kafka-go readers and group) before returning.
//
// The exceptions belong to the PostgreSQL pool that internal/testkit/pgtest shares
// across the whole test binary and never closes (it has no hook at binary
// exit). The engine never opens a pool; it uses the Store it is given.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The pool's health-check loop runs for the pool's lifetime.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		// pgconn starts a background reader on a connection when a write
		// to the server takes over 15 ms (a large message such as the
		// quarantined record over 1 MiB, or any write on a loaded
		// machine), to avoid a write/read deadlock. Stop only asks it to
		// stop after its read in progress returns, so on an idle pooled
		// connection it stays blocked in Read until the connection is used
		// again or closed.
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"),
	)
}
