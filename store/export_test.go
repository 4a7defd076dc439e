package store

import "github.com/jackc/pgx/v5/pgconn"

// QueryEncoded is queryEncoded, for the external tests.
var QueryEncoded = queryEncoded

// DrainParamBufs empties the kept parameter buffers, so that the next
// statement starts a new one.
func DrainParamBufs() {
	for {
		select {
		case <-paramBufs:
		default:
			return
		}
	}
}

// SwapDiff and CompareForSwap are swapDiff and compareForSwap, for the
// external tests.
var (
	SwapDiff       = swapDiff
	CompareForSwap = compareForSwap
)

// SetWorkersLackedMemory replaces the test of an error of the server's
// shared memory until the test ends.
func SetWorkersLackedMemory(t interface{ Cleanup(func()) }, f func(*pgconn.PgError) bool) {
	old := workersLackedMemory
	workersLackedMemory = f
	t.Cleanup(func() { workersLackedMemory = old })
}
