package store_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/store"
)

// TestTLSRisk: a server not on this host must be reached over TLS whose
// certificate is verified; pgx's default (sslmode=prefer: unverified TLS
// with a plaintext fallback) is a risk, and so are disable, allow and
// require. A server on this host (loopback, localhost, a Unix socket) is
// not at risk whatever the mode.
func TestTLSRisk(t *testing.T) {
	t.Parallel()
	ca := caFile(t)
	for _, tc := range []struct {
		url  string
		want string // in the risk; empty: no risk
	}{
		{"postgres://u@db.example.com:5432/app?sslmode=disable", "db.example.com:5432 without TLS"},
		{"postgres://u@db.example.com:5432/app?sslmode=allow", "db.example.com:5432 with unverified TLS that falls back to plaintext"},
		{"postgres://u@db.example.com:5432/app?sslmode=prefer", "db.example.com:5432 with unverified TLS that falls back to plaintext"},
		{"postgres://u@db.example.com/app", "with unverified TLS that falls back to plaintext"}, // prefer is the default
		{"postgres://u@10.0.0.7:5432/app?sslmode=require", "10.0.0.7:5432 with TLS whose certificate is not verified"},
		{"postgres://u@db.example.com:5432/app?sslmode=require&sslrootcert=" + ca, ""}, // libpq's verify-ca
		{"postgres://u@db.example.com:5432/app?sslmode=verify-ca&sslrootcert=" + ca, ""},
		{"postgres://u@db.example.com:5432/app?sslmode=verify-ca", "db.example.com:5432 with TLS that accepts any certificate a public CA signed, for any name (sslmode=verify-ca without sslrootcert)"},
		{"postgres://u@db.example.com:5432/app?sslmode=verify-full&sslrootcert=" + ca, ""},
		{"postgres://u@db.example.com:5432/app?sslmode=verify-full", ""}, // the system's roots
		{"postgres://u@db.example.com:5432/app?sslrootcert=system", ""},  // verify-full
		{"postgres://u@127.0.0.1:5432/app?sslmode=disable", ""},
		{"postgres://u@127.0.0.2:5432/app?sslmode=prefer", ""},
		{"postgres://u@[::1]:5432/app?sslmode=disable", ""},
		{"postgres://u@localhost:5432/app?sslmode=disable", ""},
		{"host=/var/run/postgresql user=u dbname=app sslmode=disable", ""},
		{"postgres:///app?host=/tmp&sslmode=prefer", ""},
		// Every host pgx may try counts, not only the first.
		{"postgres://u@127.0.0.1:5432,db-2.example.com:5433/app?sslmode=disable", "db-2.example.com:5433 without TLS"},
		{"postgres://u@db-1.example.com,db-2.example.com/app?sslmode=require", "db-1.example.com:5432 with TLS whose certificate is not verified (sslmode=require); db-2.example.com:5432"},
		{"postgres://%%bad", ""}, // opening it says what is wrong
	} {
		got := store.TLSRisk(tc.url)
		if tc.want == "" {
			require.Empty(t, got, tc.url)
		} else {
			require.Contains(t, got, tc.want, tc.url)
		}
	}
}

// caFile writes a self-signed CA certificate and returns its path.
func caFile(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return path
}
