//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

type arm struct {
	at   int64
	stop bool // SIGSTOP rather than SIGKILL
}

var (
	parseOnce sync.Once
	armed     map[string]arm
	hits      sync.Map // name -> *atomic.Int64
)

func parse() {
	armed = map[string]arm{}
	for _, kv := range strings.Split(os.Getenv(Env), ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		n, action, _ := strings.Cut(n, ":")
		if at, err := strconv.ParseInt(n, 10, 64); err == nil && at > 0 {
			armed[name] = arm{at: at, stop: action == "stop"}
		}
	}
}

// Unfenced reports whether PROJECTOR_FAILPOINTS turns the partition fence
// off (no-fence=1).
func Unfenced() bool {
	parseOnce.Do(parse)
	_, ok := armed[NoFence]
	return ok
}

// Hit counts a hit of the point name and kills the process at the armed
// hit.
func Hit(name string) {
	parseOnce.Do(parse)
	a, ok := armed[name]
	if !ok {
		return
	}
	c, _ := hits.LoadOrStore(name, new(atomic.Int64))
	if c.(*atomic.Int64).Add(1) != a.at {
		return
	}
	if a.stop {
		fmt.Fprintf(os.Stderr, "failpoint %s: SIGSTOP\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
