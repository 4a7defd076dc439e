package kafka

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: a closed
// partition reader must have stopped its fetcher, a fetch in flight
// included.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
