package demo

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestThrowawayClusterStartsServesAndIsRemoved is the demo's fallback when
// no server answers: initdb and pg_ctl from this machine's binaries, as the
// postgres user when run as root.
func TestThrowawayClusterStartsServesAndIsRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster; skipped under -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc, err := startTempCluster(ctx, t.Logf)
	require.NoError(t, err, "the demo's throwaway cluster needs the PostgreSQL server binaries (Debian package postgresql)")
	conn, err := pgx.Connect(ctx, tc.URL)
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	require.NoError(t, conn.Close(ctx))
	tc.Stop()
	_, err = os.Stat(tc.dir)
	require.True(t, os.IsNotExist(err), "the cluster's files are removed")
}
