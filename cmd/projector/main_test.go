package main

// The tests of this package run the built binary, as an operator would: they
// build cmd/projector once in TestMain and start it with os/exec, against
// an in-process Kafka-protocol broker (internal/testkit/kafkatest) and the test
// PostgreSQL (internal/testkit/pgtest). They judge it only by its exit codes, its
// output, its HTTP endpoints and the tables it writes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/testkit/pgtest"
)

// bin is the projector binary built by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "projector-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "projector tests: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "projector")
	// Not race-instrumented on purpose: the binary is the product under
	// test, the race detector covers this test process.
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "projector tests: go build:", err)
		return 1
	}
	return m.Run()
}

// baseEnv is this process's environment without the variables the
// projector reads, so a developer's settings cannot leak into a test.
func baseEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "DATABASE_URL" || strings.HasPrefix(name, "PROJECTOR_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// dbEnv is baseEnv with DATABASE_URL pointing at the test PostgreSQL.
func dbEnv(extra ...string) []string {
	return baseEnv(append([]string{"DATABASE_URL=" + pgtest.URL()}, extra...)...)
}

// result is one finished run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s\n--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// exitCode is the process's exit status; a process killed by a signal
// counts as -1.
func exitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return -1, err
}

// runBin runs the binary to completion with env, failing the test if it
// takes longer than within.
func runBin(t *testing.T, within time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	if ctx.Err() != nil {
		t.Fatalf("projector %s: still running after %s (killed)\n%s", strings.Join(args, " "), within, res)
	}
	res.code, err = exitCode(err)
	require.NoError(t, err, "projector %s", strings.Join(args, " "))
	t.Logf("projector %s: exit %d in %s", strings.Join(args, " "), res.code, time.Since(start).Round(time.Millisecond))
	return res
}

// proc is a long-running projector (run) under test.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	logs *logSink      // stderr, where the logs go
	out  *logSink      // stdout
	done chan struct{} // closed once the process has exited
	code int           // valid after done
	werr error
}

// startBin starts the binary in the background. It is killed at cleanup if
// the test did not stop it, and its log is printed if the test failed.
func startBin(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	return startExe(t, bin, name, env, args...)
}

// startExe is [startBin] for another build of the binary.
func startExe(t *testing.T, exe, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, logs: newLogSink(), out: newLogSink(), done: make(chan struct{})}
	p.cmd = exec.Command(exe, args...)
	p.cmd.Env = env
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.logs
	p.cmd.WaitDelay = 5 * time.Second
	require.NoError(t, p.cmd.Start(), "start %s", name)
	go func() {
		err := p.cmd.Wait()
		p.code, p.werr = exitCode(err)
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s stdout:\n%s\n--- %s stderr (exit %d):\n%s", p.name, p.out.String(), p.name, p.code, p.logs.String())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// requireAlive fails the test if the process has exited.
func (p *proc) requireAlive() {
	p.t.Helper()
	if p.exited() {
		p.t.Fatalf("%s exited with %d (%v) while it should run\n%s", p.name, p.code, p.werr, p.logs.String())
	}
}

// stop sends SIGTERM and requires exit 0 within the deadline.
func (p *proc) stop(within time.Duration) {
	p.t.Helper()
	p.stopWith(syscall.SIGTERM, within)
}

// stopWith sends sig and requires exit 0 within the deadline.
func (p *proc) stopWith(sig os.Signal, within time.Duration) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig), "%v %s", sig, p.name)
	start := time.Now()
	select {
	case <-p.done:
	case <-time.After(within):
		p.t.Fatalf("%s did not exit within %s of %v\n%s", p.name, within, sig, p.logs.String())
	}
	require.NoError(p.t, p.werr)
	require.Equal(p.t, 0, p.code, "%s: exit code after %v\n%s", p.name, sig, p.logs.String())
	p.t.Logf("%s exited 0 %s after %v", p.name, time.Since(start).Round(time.Millisecond), sig)
}

// httpAddr waits for the "serving" log line (the binary logs JSON, see
// runArgs) and returns the address it bound; --http-addr 127.0.0.1:0 lets
// the kernel pick a free port with no race.
func (p *proc) httpAddr(within time.Duration) string {
	p.t.Helper()
	var addr string
	eventually(p.t, within, p.name+" serves HTTP", func() (bool, string) {
		p.requireAlive()
		for _, line := range p.logs.lines() {
			var l struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "serving health, status and metrics" && l.Addr != "" {
				addr = l.Addr
				return true, ""
			}
		}
		return false, "no 'serving health, status and metrics' log line yet"
	})
	return addr
}

// logSink collects a process's output, safe for the exec copier and the
// test to use at once.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func newLogSink() *logSink { return &logSink{} }

func (s *logSink) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func (s *logSink) lines() []string { return strings.Split(s.String(), "\n") }

// eventually polls cond until it holds or within has passed; the message
// cond returns says what it saw last, for the failure.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last seen: %s", what, within, last)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: test context done: %v", what, t.Context().Err())
		case <-tick.C:
		}
	}
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// get fetches http://addr/path and returns the status code and body.
func get(addr, path string) (int, []byte, error) {
	resp, err := httpClient.Get("http://" + addr + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// liveStatus is the part of a running instance's /status the tests read.
type liveStatus struct {
	Topic      string `json:"topic"`
	Group      string `json:"group"`
	Owner      string `json:"owner"`
	Generation int32  `json:"generation"`
	Ready      bool   `json:"ready"`
	Partitions []struct {
		Partition     int   `json:"partition"`
		Position      int64 `json:"next_offset"`
		HighWatermark int64 `json:"high_watermark"`
		Lag           int64 `json:"lag"`
		Epoch         int64 `json:"epoch"`
	} `json:"partitions"`
	Counters struct {
		Consumed    int64 `json:"consumed"`
		Applied     int64 `json:"applied"`
		Deleted     int64 `json:"deleted"`
		Stale       int64 `json:"stale"`
		Duplicates  int64 `json:"duplicates"`
		Conflicts   int64 `json:"conflicts"`
		Held        int64 `json:"held"`
		Quarantined int64 `json:"quarantined"`
		Batches     int64 `json:"batches"`
		Fenced      int64 `json:"fenced"`
		HeldJobs    int64 `json:"held_jobs"`
	} `json:"counters"`
}

func fetchStatus(addr string) (*liveStatus, error) {
	code, body, err := get(addr, "/status")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/status answered %d: %s", code, body)
	}
	var s liveStatus
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("/status: %w: %s", err, body)
	}
	return &s, nil
}

// owned lists the partitions an instance's /status says it works.
func (s *liveStatus) owned() []int {
	out := []int{}
	for _, p := range s.Partitions {
		out = append(out, p.Partition)
	}
	return out
}
