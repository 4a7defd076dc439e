package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var allCommands = []string{"run", "rebuild", "status", "explain", "verify", "demo", "bench"}

// runFlags are the flags of `projector run` with their variables, as
// docs/reference/flags.md lists them.
var runFlags = map[string]string{
	"database-url": "DATABASE_URL", "brokers": "PROJECTOR_BROKERS", "topic": "PROJECTOR_TOPIC",
	"group": "PROJECTOR_GROUP", "start": "PROJECTOR_START", "schema": "PROJECTOR_SCHEMA",
	"table": "PROJECTOR_TABLE", "tombstone-retention": "PROJECTOR_TOMBSTONE_RETENTION", "memory-limit": "PROJECTOR_MEMORY_LIMIT", "batch-size": "PROJECTOR_BATCH_SIZE", "batch-linger": "PROJECTOR_BATCH_LINGER", "batches-in-flight": "PROJECTOR_BATCHES_IN_FLIGHT",
	"gap-wait": "PROJECTOR_GAP_WAIT", "reread": "PROJECTOR_REREAD", "reread-window": "PROJECTOR_REREAD_WINDOW",
	"reread-max-bytes": "PROJECTOR_REREAD_MAX_BYTES", "snapshot-url": "PROJECTOR_SNAPSHOT_URL",
	"snapshot-timeout": "PROJECTOR_SNAPSHOT_TIMEOUT", "snapshot-timeout-max": "PROJECTOR_SNAPSHOT_TIMEOUT_MAX",
	"snapshot-redirects": "PROJECTOR_SNAPSHOT_REDIRECTS", "snapshot-concurrency": "PROJECTOR_SNAPSHOT_CONCURRENCY", "gap-retry-max": "PROJECTOR_GAP_RETRY_MAX",
	"http-addr": "PROJECTOR_HTTP_ADDR", "owner": "PROJECTOR_OWNER",
	"api-addr": "PROJECTOR_API_ADDR", "api-max-waiters": "PROJECTOR_API_MAX_WAITERS", "notify": "PROJECTOR_NOTIFY",
	"log-level": "PROJECTOR_LOG_LEVEL", "log-format": "PROJECTOR_LOG_FORMAT",
	"group-session-timeout": "PROJECTOR_GROUP_SESSION_TIMEOUT", "group-heartbeat-interval": "PROJECTOR_GROUP_HEARTBEAT_INTERVAL",
	"group-rebalance-timeout": "PROJECTOR_GROUP_REBALANCE_TIMEOUT", "group-join-backoff": "PROJECTOR_GROUP_JOIN_BACKOFF",
	"ready-max-lag": "PROJECTOR_READY_MAX_LAG", "stall-timeout": "PROJECTOR_STALL_TIMEOUT", "kafka-tls": "PROJECTOR_KAFKA_TLS", "kafka-tls-ca": "PROJECTOR_KAFKA_TLS_CA",
	"kafka-tls-cert": "PROJECTOR_KAFKA_TLS_CERT", "kafka-tls-key": "PROJECTOR_KAFKA_TLS_KEY",
	"kafka-tls-server-name": "PROJECTOR_KAFKA_TLS_SERVER_NAME", "kafka-sasl-mechanism": "PROJECTOR_KAFKA_SASL_MECHANISM",
	"kafka-sasl-username": "PROJECTOR_KAFKA_SASL_USERNAME", "kafka-sasl-password-file": "PROJECTOR_KAFKA_SASL_PASSWORD_FILE",
	"kafka-isolation": "PROJECTOR_KAFKA_ISOLATION", "gap-log-retention": "PROJECTOR_GAP_LOG_RETENTION", "gap-log-max-rows": "PROJECTOR_GAP_LOG_MAX_ROWS",
	"source": "PROJECTOR_SOURCE", "sqs-queue-url": "PROJECTOR_SQS_QUEUE_URL", "sqs-endpoint": "PROJECTOR_SQS_ENDPOINT",
	"sqs-region": "PROJECTOR_SQS_REGION", "sqs-wait": "PROJECTOR_SQS_WAIT", "sqs-visibility": "PROJECTOR_SQS_VISIBILITY",
	"sqs-max-messages": "PROJECTOR_SQS_MAX_MESSAGES",
	"cache-bytes":      "PROJECTOR_CACHE_BYTES", "claim-lock-timeout": "PROJECTOR_CLAIM_LOCK_TIMEOUT",
	"idle-in-transaction-timeout": "PROJECTOR_IDLE_IN_TRANSACTION_TIMEOUT", "statement-timeout": "PROJECTOR_STATEMENT_TIMEOUT",
}

// flagLine is one flag of a command's help: "  --name type  [VARIABLE]".
var flagLine = regexp.MustCompile(`(?m)^  --([a-z-]+)\b.*\[([A-Z_]+)\]$`)

func helpFlags(help string) map[string]string {
	out := map[string]string{}
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		out[m[1]] = m[2]
	}
	return out
}

func TestUsage(t *testing.T) {
	t.Parallel()

	t.Run("no arguments", func(t *testing.T) {
		t.Parallel()
		r := runBin(t, 10*time.Second, baseEnv())
		require.Equal(t, 2, r.code, "%s", r)
		require.Empty(t, r.stdout)
		require.Contains(t, r.stderr, "Usage:")
		for _, c := range allCommands {
			require.Contains(t, r.stderr, "\n  "+c+" ", "%s", r)
		}
	})

	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			r := runBin(t, 10*time.Second, baseEnv(), args...)
			require.Equal(t, 0, r.code, "%s", r)
			require.Contains(t, r.stdout, "Usage:")
			require.Contains(t, r.stdout, "Exit codes: 0 success, 1 runtime failure, 2 bad usage or configuration,\n3 drift remains (projector verify).")
			for _, c := range allCommands {
				require.Regexp(t, fmt.Sprintf(`(?m)^  %s\s+\S`, c), r.stdout, "command %s with its summary", c)
			}
		})
	}

	t.Run("run --help", func(t *testing.T) {
		t.Parallel()
		r := runBin(t, 10*time.Second, baseEnv(), "run", "--help")
		require.Equal(t, 0, r.code, "%s", r)
		require.Contains(t, r.stdout, "projector run [flags]")
		require.Equal(t, runFlags, helpFlags(r.stdout), "every flag with its environment variable\n%s", r.stdout)
		// "help run" prints the same.
		h := runBin(t, 10*time.Second, baseEnv(), "help", "run")
		require.Equal(t, 0, h.code, "%s", h)
		require.Equal(t, r.stdout, h.stdout)
	})

	// Every command's help lists its flags, each with the variable the
	// naming rule gives it.
	for _, c := range allCommands {
		t.Run(c+" --help", func(t *testing.T) {
			t.Parallel()
			r := runBin(t, 10*time.Second, baseEnv(), c, "--help")
			require.Equal(t, 0, r.code, "%s", r)
			require.Contains(t, r.stdout, "projector "+c+" [flags]")
			flags := helpFlags(r.stdout)
			require.NotEmpty(t, flags)
			require.Equal(t, strings.Count(r.stdout, "\n  --"), len(flags), "a flag line without its variable:\n%s", r.stdout)
			for name, env := range flags {
				want := "PROJECTOR_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
				if name == "database-url" {
					want = "DATABASE_URL"
				}
				require.Equal(t, want, env, "--%s", name)
			}
			require.Contains(t, flags, "database-url")
		})
	}
}

func TestBadUsageExits2(t *testing.T) {
	t.Parallel()
	const brokers = "127.0.0.1:9" // never dialled: the settings fail first
	db := "DATABASE_URL=postgres://postgres@127.0.0.1:1/x?connect_timeout=2"
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string // in stderr
	}{
		{"unknown command", nil, []string{"frobnicate"}, []string{`unknown command "frobnicate"`, "Usage:"}},
		{"unknown flag", nil, []string{"run", "--frobnicate"}, []string{"frobnicate"}},
		{"unknown flag of status", nil, []string{"status", "--brokerz", "x"}, []string{"brokerz"}},
		{"stray argument", []string{db}, []string{"run", "--brokers", brokers, "extra"}, []string{`unexpected argument "extra"`}},
		{"no DATABASE_URL", nil, []string{"run", "--brokers", brokers}, []string{"DATABASE_URL"}},
		{"empty DATABASE_URL", []string{"DATABASE_URL= "}, []string{"run", "--brokers", brokers}, []string{"DATABASE_URL"}},
		{"bad percent encoding", []string{"DATABASE_URL=postgres://%%bad"}, []string{"run", "--brokers", brokers}, []string{"DATABASE_URL", "not a valid PostgreSQL connection string"}},
		{"not a url at all", []string{"DATABASE_URL=not a url at all"}, []string{"run", "--brokers", brokers}, []string{"DATABASE_URL", "not a valid PostgreSQL connection string"}},
		{"bad --database-url", nil, []string{"run", "--brokers", brokers, "--database-url", "postgres://%%bad"}, []string{"not a valid PostgreSQL connection string"}},
		{"no brokers", []string{db}, []string{"run"}, []string{"brokers"}},
		{"broker without port", []string{db}, []string{"run", "--brokers", "kafka-1"}, []string{"--brokers", "kafka-1"}},
		{"bad --start", []string{db}, []string{"run", "--brokers", brokers, "--start", "middle"}, []string{"--start", "middle"}},
		{"bad --kafka-isolation", []string{db}, []string{"run", "--brokers", brokers, "--kafka-isolation", "read_some"}, []string{"--kafka-isolation", "read_some", "read_committed or read_uncommitted"}},
		{"negative --gap-wait", []string{db}, []string{"run", "--brokers", brokers, "--gap-wait", "-1s"}, []string{"--gap-wait"}},
		{"bad --gap-wait", []string{db}, []string{"run", "--brokers", brokers, "--gap-wait", "soon"}, []string{"gap-wait"}},
		{"negative --tombstone-retention", []string{db}, []string{"run", "--brokers", brokers, "--tombstone-retention", "-1h"}, []string{"--tombstone-retention", "0 keeps tombstones for ever"}},
		{"relative --snapshot-url", []string{db}, []string{"run", "--brokers", brokers, "--snapshot-url", "authority:8080/x"}, []string{"--snapshot-url"}},
		{"ftp --snapshot-url", []string{db}, []string{"run", "--brokers", brokers, "--snapshot-url", "ftp://authority"}, []string{"--snapshot-url"}},
		{"--snapshot-timeout past --snapshot-timeout-max", []string{db}, []string{"run", "--brokers", brokers, "--snapshot-timeout", "3m", "--snapshot-timeout-max", "2m"}, []string{"--snapshot-timeout-max 2m0s is below --snapshot-timeout 3m0s"}},
		{"bad --snapshot-redirects", []string{db}, []string{"run", "--brokers", brokers, "--snapshot-redirects", "any"}, []string{`--snapshot-redirects "any": want same-origin or none`}},
		{"--snapshot-timeout-max 0", []string{db}, []string{"run", "--brokers", brokers, "--snapshot-timeout-max", "0s"}, []string{"--snapshot-timeout-max"}},
		{"--batch-size 0", []string{db}, []string{"run", "--brokers", brokers, "--batch-size", "0"}, []string{"--batch-size"}},
		{"negative --batch-linger", []string{db}, []string{"run", "--brokers", brokers, "--batch-linger", "-1ms"}, []string{"--batch-linger"}},
		{"--batches-in-flight below -1", []string{db}, []string{"run", "--brokers", brokers, "--batches-in-flight", "-2"}, []string{"--batches-in-flight -2", "want -1 (no bound)"}},
		{"bad --log-level", []string{db}, []string{"run", "--brokers", brokers, "--log-level", "loud"}, []string{"--log-level", "loud"}},
		{"bad --log-format", []string{db}, []string{"run", "--brokers", brokers, "--log-format", "xml"}, []string{"--log-format"}},
		{"bad --schema", []string{db}, []string{"run", "--brokers", brokers, "--schema", "1; DROP"}, []string{"schema"}},
		{"PROJECTOR_BATCH_SIZE=abc", []string{db, "PROJECTOR_BATCH_SIZE=abc"}, []string{"run", "--brokers", brokers}, []string{"PROJECTOR_BATCH_SIZE"}},
		{"PROJECTOR_GAP_WAIT=-5s", []string{db, "PROJECTOR_GAP_WAIT=-5s"}, []string{"run", "--brokers", brokers}, []string{"--gap-wait"}},
		{"PROJECTOR_REREAD=maybe", []string{db, "PROJECTOR_REREAD=maybe"}, []string{"run", "--brokers", brokers}, []string{"PROJECTOR_REREAD"}},
		// The environment is read: brokers from PROJECTOR_BROKERS, so
		// the missing DATABASE_URL is what is reported.
		{"brokers from the environment", []string{"PROJECTOR_BROKERS=" + brokers}, []string{"run"}, []string{"DATABASE_URL"}},
		// A flag wins over its variable: the bad variable is not read.
		{"flag wins over variable", []string{"PROJECTOR_BATCH_SIZE=abc"}, []string{"run", "--brokers", brokers, "--batch-size", "10"}, []string{"DATABASE_URL"}},
		{"empty --schema", []string{db}, []string{"run", "--brokers", brokers, "--schema", ""}, []string{"--schema", "empty"}},
		{"empty --table", []string{db}, []string{"run", "--brokers", brokers, "--table="}, []string{"--table", "empty"}},
		{"empty PROJECTOR_SCHEMA", []string{db, "PROJECTOR_SCHEMA="}, []string{"run", "--brokers", brokers}, []string{"--schema", "PROJECTOR_SCHEMA", "empty"}},
		{"empty PROJECTOR_TABLE", []string{db, "PROJECTOR_TABLE="}, []string{"run", "--brokers", brokers}, []string{"--table", "PROJECTOR_TABLE", "empty"}},
		{"rebuild empty --table", []string{db}, []string{"rebuild", "--brokers", brokers, "--table", ""}, []string{"--table", "empty"}},
		{"rebuild empty PROJECTOR_SCHEMA", []string{db, "PROJECTOR_SCHEMA="}, []string{"rebuild", "--brokers", brokers}, []string{"--schema", "empty"}},
		{"rebuild empty --group", []string{db}, []string{"rebuild", "--brokers", brokers, "--group", ""}, []string{"--group", "empty"}},
		{"rebuild empty PROJECTOR_GROUP", []string{db, "PROJECTOR_GROUP="}, []string{"rebuild", "--brokers", brokers}, []string{"--group", "PROJECTOR_GROUP", "empty"}},
		{"status empty --schema", []string{db}, []string{"status", "--schema", ""}, []string{"--schema", "empty"}},
		{"status empty PROJECTOR_TABLE", []string{db, "PROJECTOR_TABLE="}, []string{"status"}, []string{"--table", "empty"}},
		{"mixed-case --table", []string{db}, []string{"run", "--brokers", brokers, "--table", "Jobs"}, []string{`"Jobs"`, "lower-case"}},
		{"mixed-case --schema", []string{db}, []string{"status", "--schema", "Public"}, []string{`"Public"`, "lower-case"}},
		{"reserved --table", []string{db}, []string{"run", "--brokers", brokers, "--table", "projector_held"}, []string{"projector_held", "reserved"}},
		{"rebuild reserved --table", []string{db}, []string{"rebuild", "--brokers", brokers, "--table", "projector_rebuild_jobs"}, []string{"reserved"}},
		{"status reserved --table", []string{db}, []string{"status", "--table", "projector_quarantine"}, []string{"reserved"}},
		{"41-byte --table", []string{db}, []string{"run", "--brokers", brokers, "--table", strings.Repeat("t", 41)}, []string{"41 bytes", "at most 40"}},
		{"rebuild 41-byte --table", []string{db}, []string{"rebuild", "--brokers", brokers, "--table", strings.Repeat("t", 41)}, []string{"at most 40"}},
		{"status 41-byte --table", []string{db}, []string{"status", "--table", strings.Repeat("t", 41)}, []string{"at most 40"}},
		{"broker port not a number", []string{db}, []string{"run", "--brokers", "kafka:notaport"}, []string{"--brokers", "kafka:notaport", "port"}},
		{"broker port 0", []string{db}, []string{"run", "--brokers", "127.0.0.1:9092,kafka:0"}, []string{"--brokers", "kafka:0"}},
		{"broker port too high", []string{db}, []string{"rebuild", "--brokers", "kafka:65536"}, []string{"--brokers", "kafka:65536"}},
		{"broker without host", []string{db}, []string{"run", "--brokers", ":9092"}, []string{"--brokers", `":9092"`}},
		{"status bad --brokers", []string{db}, []string{"status", "--brokers", "kafka:x"}, []string{"--brokers", "kafka:x"}},
		{"bad --http-addr", []string{db}, []string{"run", "--brokers", brokers, "--http-addr", "nonsense"}, []string{"--http-addr", "nonsense"}},
		{"bad --http-addr port", []string{db}, []string{"run", "--brokers", brokers, "--http-addr", ":99999"}, []string{"--http-addr", "99999"}},
		{"duration flag without unit", []string{db}, []string{"run", "--brokers", brokers, "--batch-linger", "50"}, []string{`--batch-linger "50"`, "10s"}},
		{"duration flag without value", []string{db}, []string{"run", "--brokers", brokers, "--gap-wait"}, []string{"--gap-wait", "10s"}},
		{"int flag", []string{db}, []string{"run", "--brokers", brokers, "--batch-size", "many"}, []string{`--batch-size "many"`, "whole number"}},
		{"duration variable", []string{db, "PROJECTOR_GAP_WAIT=soon"}, []string{"run", "--brokers", brokers}, []string{"PROJECTOR_GAP_WAIT", "--gap-wait", "10s"}},
		{"heartbeat not below session", []string{db}, []string{"run", "--brokers", brokers, "--group-heartbeat-interval", "10s", "--group-session-timeout", "10s"},
			[]string{"--group-heartbeat-interval", "--group-session-timeout"}},
		{"zero --group-rebalance-timeout", []string{db}, []string{"rebuild", "--brokers", brokers, "--group-rebalance-timeout", "0s"}, []string{"--group-rebalance-timeout"}},
		{"bad --group-join-backoff", []string{db}, []string{"run", "--brokers", brokers, "--group-join-backoff", "x"}, []string{"--group-join-backoff", "10s"}},
		{"negative --batch-linger says zero is allowed", []string{db}, []string{"run", "--brokers", brokers, "--batch-linger", "-5ms"}, []string{"--batch-linger -5ms", "must be zero", "5ms"}},
		{"--statement-timeout above half --stall-timeout", []string{db}, []string{"run", "--brokers", brokers, "--statement-timeout", "5m"}, []string{"--stall-timeout 2m0s", "--statement-timeout 5m0s", "10m0s or more"}},
		{"zero --statement-timeout", []string{db}, []string{"run", "--brokers", brokers, "--statement-timeout", "0s"}, []string{"--statement-timeout", "at least 1ms", "5m"}},
		{"rebuild negative --claim-lock-timeout", []string{db}, []string{"rebuild", "--brokers", brokers, "--claim-lock-timeout", "-1s"}, []string{"--claim-lock-timeout", "2s"}},
		{"idle timeout variable below 1ms", []string{db, "PROJECTOR_IDLE_IN_TRANSACTION_TIMEOUT=500us"}, []string{"run", "--brokers", brokers}, []string{"--idle-in-transaction-timeout", "at least 1ms"}},
		{"bad --statement-timeout", []string{db}, []string{"run", "--brokers", brokers, "--statement-timeout", "long"}, []string{"--statement-timeout", "10s"}},
		{"rebuild negative --held-wait", []string{db}, []string{"rebuild", "--brokers", brokers, "--held-wait", "-1s"}, []string{"--held-wait"}},
		{"rebuild no brokers", []string{db}, []string{"rebuild"}, []string{"brokers"}},
		{"status --limit -1", []string{db}, []string{"status", "--limit", "-1"}, []string{"--limit"}},
		{"status --limit abc", []string{db}, []string{"status", "--limit", "abc"}, []string{"limit"}},
		{"status no DATABASE_URL", nil, []string{"status"}, []string{"DATABASE_URL"}},
		{"demo --jobs 0", nil, []string{"demo", "--jobs", "0"}, []string{"--jobs"}},
		{"demo --events-per-job 1", nil, []string{"demo", "--events-per-job", "1"}, []string{"--events-per-job"}},
		{"bench --events 10", nil, []string{"bench", "--events", "10"}, []string{"--events"}},
		{"bench --jobs above --events", nil, []string{"bench", "--events", "1000", "--jobs", "2000"}, []string{"--jobs"}},
		{"bench too many events a job", nil, []string{"bench", "--events", "2000000", "--jobs", "1000"}, []string{"--jobs 1000", "at most 1000 events a job", "--jobs 2000 or more"}},
		{"bench --mix unknown", nil, []string{"bench", "--mix", "lots"}, []string{"--mix", "snapshots, deltas, mixed"}},
		{"bench --state-bytes -1", nil, []string{"bench", "--state-bytes", "-1"}, []string{"--state-bytes"}},
		{"bench --preload -1", nil, []string{"bench", "--preload", "-1"}, []string{"--preload"}},
		{"bench --live --rate 0", nil, []string{"bench", "--live", "--rate", "0"}, []string{"--rate"}},
		{"bench --live --duration 10ms", nil, []string{"bench", "--live", "--duration", "10ms"}, []string{"--duration", "60s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runBin(t, 20*time.Second, baseEnv(tc.env...), tc.args...)
			require.Equal(t, 2, r.code, "%s", r)
			require.Empty(t, r.stdout, "usage errors go to stderr")
			for _, w := range tc.want {
				require.Contains(t, r.stderr, w, "%s", r)
			}
			if tc.args[0] != "frobnicate" {
				// One line saying what is wrong, then where the help is; not the whole help.
				ls := lines(r.stderr)
				require.LessOrEqual(t, len(ls), 2, "%s", r)
				require.True(t, strings.HasPrefix(ls[0], "projector "+tc.args[0]+": "), "%s", r)
				if len(ls) == 2 {
					require.Equal(t, "Run 'projector "+tc.args[0]+" --help' for the flags.", ls[1])
				}
			}
		})
	}
}

// TestUnknownFlagNamesIt: the parse error names the flag on its one line.
func TestUnknownFlagNamesIt(t *testing.T) {
	t.Parallel()
	r := runBin(t, 10*time.Second, baseEnv(), "run", "--no-such-flag")
	require.Equal(t, 2, r.code, "%s", r)
	first := lines(r.stderr)[0]
	require.Contains(t, first, "--no-such-flag", "the flag as it is written, with two dashes")
	require.NotContains(t, r.stderr, "Usage:")
}

// TestUnreachableDatabaseExits1: settings are right but the server does not
// answer: a runtime failure, with the error, and no password in it. (run
// waits for it instead: TestRunWaitsForAnUnreachableDatabase.)
func TestUnreachableDatabaseExits1(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"status"},
		{"rebuild", "--brokers", "127.0.0.1:9"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			r := runBin(t, 30*time.Second,
				baseEnv("DATABASE_URL=postgres://postgres:s3cret@127.0.0.1:1/x?connect_timeout=2"), args...)
			require.Equal(t, 1, r.code, "%s", r)
			require.True(t, strings.HasPrefix(r.stderr, "projector "+args[0]+": "), "%s", r)
			require.Contains(t, r.stderr, "127.0.0.1:1", "%s", r)
			require.NotContains(t, r.stderr, "s3cret", "the password stays out of the message")
			require.NotContains(t, r.stderr, "--help", "a runtime failure is not a usage error")
		})
	}
}

// TestRunHTTPAddrInUse: the settings are right, but the address is taken:
// exit 1, after the migrations ran.
func TestRunHTTPAddrInUse(t *testing.T) {
	t.Parallel()
	s := newStory(t, 1)
	p := startBin(t, "run holder", dbEnv(), s.runArgs("g-holder", "holder")...)
	addr := p.httpAddr(15 * time.Second)

	r := runBin(t, 30*time.Second, dbEnv(), s.runArgs("g-second", "second", "--http-addr", addr)...)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, "--http-addr "+addr, "%s", r)
	p.stop(stopWithin)
}

// TestEveryTableTakingCommandChecksNames: the name rules of run, rebuild
// and status hold for every other command that takes --schema and
// --table, before anything connects.
func TestEveryTableTakingCommandChecksNames(t *testing.T) {
	t.Parallel()
	db := "DATABASE_URL=postgres://postgres@127.0.0.1:1/x?connect_timeout=2"
	for _, cmd := range []struct{ before, after []string }{
		{[]string{"explain"}, []string{"job-1"}},
		{[]string{"verify", "--snapshot-url", "http://127.0.0.1:9", "--all"}, nil},
		{[]string{"quarantine", "list"}, nil},
	} {
		for _, tc := range []struct {
			name string
			env  []string
			args []string
			want string
		}{
			{"empty --table", nil, []string{"--table", ""}, "--table is empty"},
			{"empty PROJECTOR_SCHEMA", []string{"PROJECTOR_SCHEMA="}, nil, "--schema is empty"},
			{"41-byte --table", nil, []string{"--table", strings.Repeat("t", 41)}, "at most 40"},
			{"reserved --table", nil, []string{"--table", "projector_held"}, "reserved"},
			{"mixed-case --table", nil, []string{"--table", "Jobs"}, "lower-case"},
		} {
			t.Run(cmd.before[0]+" "+tc.name, func(t *testing.T) {
				t.Parallel()
				args := append(append(append([]string{}, cmd.before...), tc.args...), cmd.after...)
				r := runBin(t, 20*time.Second, baseEnv(append([]string{db}, tc.env...)...), args...)
				require.Equal(t, 2, r.code, "%s", r)
				require.Contains(t, r.stderr, tc.want, "%s", r)
			})
		}
	}
}

// TestRunWaitsForAnUnreachableDatabase: the daemon started before its
// database answers waits for it, saying so (server named, no password),
// and a stop while it waits is clean.
func TestRunWaitsForAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	p := startBin(t, "run", baseEnv("DATABASE_URL=postgres://postgres:s3cret@127.0.0.1:1/x?connect_timeout=2"),
		"run", "--brokers", "127.0.0.1:9", "--http-addr", "off", "--log-format", "json")
	eventually(t, 20*time.Second, "run logs that it waits for PostgreSQL", func() (bool, string) {
		p.requireAlive()
		return p.logged("PostgreSQL does not answer at start", nil), p.logs.String()
	})
	require.Contains(t, p.logs.String(), "127.0.0.1:1", "the server is named")
	require.NotContains(t, p.logs.String(), "s3cret")
	p.stop(10 * time.Second)
}
