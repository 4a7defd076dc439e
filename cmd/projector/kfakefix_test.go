package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/bench"
	"github.com/projector/projector/internal/testkit/kafkatest"
)

// kfakeModule is the module of the in-process broker; the version is the
// one go.mod selects.
const kfakeModule = "github.com/twmb/franz-go/pkg/kfake"

// kfakeGroupFix is one edit to kfake's groups.go: old must occur exactly
// once and is replaced by with.
type kfakeGroupFix struct {
	what, old, with string
}

// kfakeGroupFixes make kfake's classic group coordinator do what Kafka's
// does in the two places where it strands a group whose members are killed
// (SIGKILL) and replaced: a member dead while its JoinGroup was parked stays
// in the group with no session timer, and a live member waiting in
// JoinGroup is expired by the session timer of its last heartbeat. The
// product keeps kfake as go.mod has it; only the broker of the churn test
// is built with these edits (see [fixedBroker]).
var kfakeGroupFixes = []kfakeGroupFix{{
	// Kafka schedules each member's session expiry when the join (or
	// sync) completes, whether or not the answer reaches the member
	// (GroupCoordinator.completeAndScheduleNextHeartbeatExpiration).
	// kfake's (*group).reply starts the timer only when the answer was
	// queued, so a member killed while its request was parked has none:
	// in a stable group it stays a member, holding partitions nobody
	// works, until some other change rebalances the group; in a
	// rebalance it is never counted as joined (reply cleared its
	// waitingReply), so the rebalance waits its full timer, restarted by
	// every join, before dropping it.
	what: "(*group).reply: start the session timer even when the answer cannot be delivered",
	old: `	if !creq.reply(kresp) {
		return
	}
	if m != nil {
		g.updateHeartbeat(m)
	}`,
	with: `	creq.reply(kresp) // patched: the session starts whether or not the answer was delivered, as in Kafka
	if m != nil {
		g.updateHeartbeat(m)
	}`,
}, {
	// Kafka does not expire a member with a request in purgatory (awaiting
	// join or sync: MemberMetadata.shouldKeepAlive); the rebalance
	// timeout bounds that wait, and its session starts again when the
	// request is answered. kfake's (*group).updateHeartbeat removes it
	// when the timer of its last heartbeat runs out, and never answers
	// its parked JoinGroup. The edit keeps every waiting member for as
	// long as it waits, where Kafka drops a new member (one with no
	// member ID yet) still waiting in JoinGroup after 5 minutes
	// (KAFKA-7610); a wait that long is far beyond the 21 s bound the
	// churn test asserts, so the difference does not touch it.
	what: "(*group).updateHeartbeat: do not expire a member waiting in JoinGroup or SyncGroup",
	old: `		if g.members[m.memberID] != m {
			return
		}
		g.updateMemberAndRebalance(m, nil, nil)`,
	with: `		if g.members[m.memberID] != m {
			return
		}
		if !m.waitingReply.empty() { // patched: a member awaiting join or sync is kept, as in Kafka
			return
		}
		g.updateMemberAndRebalance(m, nil, nil)`,
}}

// patchKfakeGroups applies fixes to the text of groups.go. An edit whose
// text is not there exactly once is an error: kfake changed, and the
// edits must be made again against the new code.
func patchKfakeGroups(src string, fixes []kfakeGroupFix) (string, error) {
	for _, f := range fixes {
		if n := strings.Count(src, f.old); n != 1 {
			return "", fmt.Errorf("kfake changed: the text of the edit %q occurs %d times in groups.go (want once); redo the edit against this kfake", f.what, n)
		}
		src = strings.Replace(src, f.old, f.with, 1)
	}
	return src, nil
}

var (
	fixedOnce sync.Once
	fixedBin  string
	fixedErr  error
)

// fixedBrokerBin is this package's binary built against a copy of kfake
// (its package files, in a temporary directory named by a replace
// directive of a temporary go.mod: go build -modfile) whose groups.go has
// [kfakeGroupFixes], once per test binary. Its bench broker mode
// (bench.BrokerChildEnv) serves that broker.
func fixedBrokerBin(t *testing.T) string {
	t.Helper()
	fixedOnce.Do(func() { fixedBin, fixedErr = buildFixedBroker(filepath.Join(filepath.Dir(bin), "fixed-kfake")) })
	require.NoError(t, fixedErr)
	return fixedBin
}

// goCmd is the go command run with GOWORK=off: the build names its own
// go.mod with -modfile, which workspace mode refuses, and the module
// queries must answer for this module's go.mod, not a workspace's.
func goCmd(args ...string) *exec.Cmd {
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	return cmd
}

// kfakeDir is the directory of the kfake that go.mod selects, in the
// module cache.
func kfakeDir() (string, error) {
	out, err := goCmd("list", "-m", "-f", "{{.Dir}}", kfakeModule).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", kfakeModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("%s is not in the module cache; run go mod download", kfakeModule)
	}
	return dir, nil
}

func buildFixedBroker(dir string) (string, error) {
	kdir, err := kfakeDir()
	if err != nil {
		return "", err
	}
	out, err := goCmd("env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mainMod := strings.TrimSpace(string(out))
	kf := filepath.Join(dir, "kfake")
	if err := os.MkdirAll(kf, 0o755); err != nil {
		return "", err
	}
	files, err := filepath.Glob(filepath.Join(kdir, "*.go"))
	if err != nil {
		return "", err
	}
	patched := false
	for _, f := range append(files, filepath.Join(kdir, "go.mod")) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		if filepath.Base(f) == "groups.go" {
			fixed, err := patchKfakeGroups(string(src), kfakeGroupFixes)
			if err != nil {
				return "", err
			}
			src = []byte(fixed)
			patched = true
		}
		if err := os.WriteFile(filepath.Join(kf, filepath.Base(f)), src, 0o644); err != nil {
			return "", err
		}
	}
	if !patched {
		return "", fmt.Errorf("kfake changed: no groups.go in %s; redo the edits against this kfake", kdir)
	}
	mod, err := os.ReadFile(mainMod)
	if err != nil {
		return "", err
	}
	sum, err := os.ReadFile(strings.TrimSuffix(mainMod, ".mod") + ".sum")
	if err != nil {
		return "", err
	}
	mod = fmt.Appendf(mod, "\nreplace %s => %s\n", kfakeModule, kf)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), mod, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		return "", err
	}
	exe := filepath.Join(dir, "projector")
	build := goCmd("build", "-modfile", filepath.Join(dir, "go.mod"), "-o", exe, ".")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build against kfake with groups.go patched: %v\n%s", err, out)
	}
	return exe, nil
}

// fixedBrokerStart is how long the patched broker may take to print its
// addresses.
const fixedBrokerStart = time.Minute

// fixedBroker starts the broker of [fixedBrokerBin] in its own process for
// t, stopped when t ends, and returns a client of it.
func fixedBroker(t *testing.T) *kafkatest.Cluster {
	t.Helper()
	cmd := exec.Command(fixedBrokerBin(t), "bench")
	cmd.Env = baseEnv(bench.BrokerChildEnv + "=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	// The addrs line is read before cmd.Wait starts, as Wait closes
	// stdout once the child exits; a child that never prints it fails
	// the test after fixedBrokerStart rather than hanging it.
	type firstLine struct {
		s   string
		err error
	}
	got := make(chan firstLine, 1)
	go func() {
		s, err := bufio.NewReader(stdout).ReadString('\n')
		got <- firstLine{s, err}
	}()
	var line firstLine
	select {
	case line = <-got:
	case <-time.After(fixedBrokerStart):
		line.err = fmt.Errorf("no addrs line within %s", fixedBrokerStart)
	}
	addrs, ok := strings.CutPrefix(strings.TrimSpace(line.s), "addrs ")
	if line.err != nil || !ok {
		_ = cmd.Process.Kill()
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = stdin.Close() // the broker serves until its stdin ends
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	require.True(t, line.err == nil && ok, "the patched broker did not start: read %q, %v", line.s, line.err)
	c := kafkatest.Connect(strings.Split(addrs, ","))
	t.Cleanup(c.Close)
	return c
}

// The edits apply to the kfake of go.mod, each once, and an edit whose
// text is missing is refused rather than skipped.
func TestKfakeGroupFixesApply(t *testing.T) {
	dir, err := kfakeDir()
	require.NoError(t, err)
	src, err := os.ReadFile(filepath.Join(dir, "groups.go"))
	require.NoError(t, err)
	patched, err := patchKfakeGroups(string(src), kfakeGroupFixes)
	require.NoError(t, err)
	require.Equal(t, len(kfakeGroupFixes), strings.Count(patched, "// patched: "))
	_, err = patchKfakeGroups(patched, kfakeGroupFixes)
	require.ErrorContains(t, err, "kfake changed")
}
