package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
)

// TestRunSASL: run against a broker that requires SCRAM-SHA-256 projects
// with the password from PROJECTOR_KAFKA_SASL_PASSWORD or from
// --kafka-sasl-password-file; with a wrong password it exits 1 within
// 30 s saying authentication failed for that mechanism and user, and the
// password shows in no output. --help never shows it either.
func TestRunSASL(t *testing.T) {
	t.Parallel()
	const user, password, wrong = "app", "correct-pony-41", "wrong-pony-97"
	m, err := scram.Mechanism(scram.SHA256, user, password)
	require.NoError(t, err)
	c := kafkatest.New(t,
		kafkatest.WithKfakeOptions(kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", user, password)),
		kafkatest.WithClientSecurity(nil, m))
	topic := kafkatest.Topic(t, c, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = c.Produce(ctx, topic, kafkatest.Record{Key: []byte("a"), Value: snapshotValue("a", 1, map[string]any{"n": 1})})
	require.NoError(t, err)

	schema := pgtest.Schema(t)
	args := []string{"--brokers", strings.Join(c.Addrs(), ","), "--topic", topic, "--schema", schema,
		"--group", "g-sasl", "--http-addr", "127.0.0.1:0", "--log-format", "json", "--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-username", user}

	res := runBin(t, 45*time.Second, dbEnv("PROJECTOR_KAFKA_SASL_PASSWORD="+wrong), append([]string{"run"}, args...)...)
	require.Equal(t, exitFailure, res.code, "%s", res)
	require.Contains(t, res.stderr, "authentication failed")
	require.Contains(t, res.stderr, "SCRAM-SHA-256")
	require.Contains(t, res.stderr, `"app"`)
	require.NotContains(t, res.stderr+res.stdout, wrong)

	pwFile := filepath.Join(t.TempDir(), "password")
	require.NoError(t, os.WriteFile(pwFile, []byte(password+"\n"), 0o600))
	p := startBin(t, "run", dbEnv(), append([]string{"run"}, append(args, "--kafka-sasl-password-file", pwFile)...)...)
	addr := p.httpAddr(15 * time.Second)
	eventually(t, 30*time.Second, "/readyz 200 through SASL", func() (bool, string) {
		p.requireAlive()
		code, body, err := get(addr, "/readyz")
		return err == nil && code == http.StatusOK, string(body)
	})
	eventually(t, 30*time.Second, "the record is projected", func() (bool, string) {
		var n int
		err := pgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM "`+schema+`".jobs`).Scan(&n)
		return err == nil && n == 1, ""
	})
	p.stop(stopWithin)
	require.NotContains(t, p.logs.String(), password)

	help := runBin(t, 10*time.Second, baseEnv("PROJECTOR_KAFKA_SASL_PASSWORD="+password), "run", "--help")
	require.Equal(t, exitOK, help.code)
	require.Contains(t, help.stdout, "PROJECTOR_KAFKA_SASL_PASSWORD")
	require.NotContains(t, help.stdout, password)
	require.NotContains(t, help.stdout, "--kafka-sasl-password ")
}

// TestRunSCRAMPasswordRefusedBySASLprep: a password SCRAM cannot use
// (a control character in it) is bad configuration: run exits 2 naming
// the mechanism and the user, and the password shows in no output.
func TestRunSCRAMPasswordRefusedBySASLprep(t *testing.T) {
	t.Parallel()
	const secret = "pony\x07-secret-77"
	res := runBin(t, 30*time.Second, dbEnv("PROJECTOR_KAFKA_SASL_PASSWORD="+secret), "run", "--brokers", "127.0.0.1:9092",
		"--topic", "t", "--group", "g", "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", "app")
	require.Equal(t, exitUsage, res.code, "%s", res)
	require.Contains(t, res.stderr, "SCRAM-SHA-512")
	require.Contains(t, res.stderr, `"app"`)
	require.NotContains(t, res.stderr+res.stdout, "secret-77")
}
