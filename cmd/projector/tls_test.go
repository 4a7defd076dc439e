package main

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWarnUnverifiedTLS: run warns, once, when DATABASE_URL reaches a
// server on another host without verified TLS (pgx's default
// sslmode=prefer included), naming the server and what to set; a server
// on this host, or one reached with sslmode=verify-full, is not warned
// about.
func TestWarnUnverifiedTLS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		warn bool
	}{
		{"postgres://app@db.example.com:5432/app", true},
		{"postgres://app@db.example.com:5432/app?sslmode=require", true},
		{"postgres://app@db.example.com:5432/app?sslmode=disable", true},
		{"postgres://app@db.example.com:5432/app?sslmode=verify-full", false},
		{"postgres://app@127.0.0.1:5432/app?sslmode=disable", false},
		{"host=/var/run/postgresql dbname=app", false},
	} {
		var out bytes.Buffer
		log := slog.New(slog.NewTextHandler(&out, nil))
		require.Equal(t, tc.warn, warnUnverifiedTLS(log, tc.url), tc.url)
		if !tc.warn {
			require.Empty(t, out.String(), tc.url)
			continue
		}
		require.Equal(t, 1, bytes.Count(out.Bytes(), []byte("\n")), out.String())
		require.Contains(t, out.String(), "level=WARN")
		require.Contains(t, out.String(), "sslmode=verify-full")
		require.Contains(t, out.String(), "db.example.com:5432")
		require.NotContains(t, out.String(), "app@", "the user is not logged")
	}
}
