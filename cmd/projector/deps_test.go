package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The product binary must not link the testing package: it would ship test
// support and register test flags. Test helpers that take testing.TB live
// apart (internal/testkit/kafkatest, internal/testkit/pgtest) from what demo and bench use
// (internal/app/broker).
func TestBinaryDoesNotLinkTesting(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "go list -deps: %s", out)
	deps := strings.Fields(string(out))
	require.NotEmpty(t, deps)
	for _, forbidden := range []string{"testing", "github.com/projector/projector/internal/testkit/kafkatest", "github.com/projector/projector/internal/testkit/pgtest", "github.com/stretchr/testify/require"} {
		require.NotContains(t, deps, forbidden, "the projector binary links %s", forbidden)
	}
}
