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

// Env names the variable a failpoints build reads.
const Env = "PROJECTOR_FAILPOINTS"

var (
	parseOnce sync.Once
	armed     map[string]int64
	hits      sync.Map // name -> *atomic.Int64
)

func parse() {
	armed = map[string]int64{}
	for _, kv := range strings.Split(os.Getenv(Env), ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		if at, err := strconv.ParseInt(n, 10, 64); err == nil && at > 0 {
			armed[name] = at
		}
	}
}

// Hit counts a hit of the point name and kills the process at the armed
// hit.
func Hit(name string) {
	parseOnce.Do(parse)
	at, ok := armed[name]
	if !ok {
		return
	}
	c, _ := hits.LoadOrStore(name, new(atomic.Int64))
	if c.(*atomic.Int64).Add(1) != at {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
