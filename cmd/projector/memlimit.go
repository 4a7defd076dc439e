package main

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/projector/projector/projection"
)

// memoryLimit is --memory-limit: the Go runtime's soft memory limit
// (debug.SetMemoryLimit). "auto" (the default) takes memoryShare of the
// container's memory limit when there is one (cgroup v2 memory.max, or v1
// memory.limit_in_bytes), and where none is found the cache's budget and a
// working part (projection.DefaultMemoryLimit, 208 MiB at the default
// cache; none for projector rebuild, see noDefault); "off" sets none; a
// size sets that. The engine's default of batches in flight is sized to
// the limit set (projection.BatchesInFlightWithin), so apply runs before
// the engine is built. Near the limit the garbage collector runs more
// often instead of letting the heap reach twice its live data, which is what keeps a pod
// under its limit; it is soft, so a live heap above it is not refused, only
// collected harder.
type memoryLimit struct {
	auto, off bool
	bytes     byteSize
	// noDefault: auto sets no limit where no container limit is found
	// (projector rebuild: a throughput job whose batches are twice run's).
	noDefault bool
}

// memoryShare is the part of a container's limit the Go heap may use:
// the rest is left to goroutine stacks, pgx's and the fetchers' buffers
// outside the heap, and the runtime's own.
const memoryShare = 0.85

// minMemoryLimit is the smallest --memory-limit taken.
const minMemoryLimit = 16 << 20

func (m *memoryLimit) String() string {
	switch {
	case m.off:
		return "off"
	case m.auto || m.bytes == 0:
		return "auto"
	}
	return m.bytes.String()
}

func (m *memoryLimit) Set(s string) error {
	// What is set is the value; which command's flag it is stays.
	defer func(noDefault bool) { m.noDefault = noDefault }(m.noDefault)
	switch strings.TrimSpace(s) {
	case "auto", "":
		*m = memoryLimit{auto: true}
		return nil
	case "off", "0":
		*m = memoryLimit{off: true}
		return nil
	}
	var b byteSize
	if err := b.Set(s); err != nil {
		return fmt.Errorf("want auto, off or a size such as 400MiB: %w", err)
	}
	if b < minMemoryLimit {
		// A limit this small would keep the collector running without
		// pause: a zero size means off, anything else is refused.
		if b == 0 {
			*m = memoryLimit{off: true}
			return nil
		}
		floor := byteSize(minMemoryLimit)
		return fmt.Errorf("%s is below %s: the collector would never rest; want auto, off or a size such as 400MiB", b.String(), floor.String())
	}
	*m = memoryLimit{bytes: b}
	return nil
}

// Get makes it a flag.Getter.
func (m *memoryLimit) Get() any { return m.String() }

// register adds --memory-limit to fs.
func (m *memoryLimit) register(fs *flag.FlagSet) {
	*m = memoryLimit{auto: true}
	fs.Var(m, "memory-limit", "the Go runtime's soft memory limit: a `size` (400MiB), off, or auto: 85% of\nthe container's memory limit (cgroup memory.max), where no container limit\nis found --cache-bytes + 144MiB (208MiB at the defaults). Near it the garbage\ncollector works harder rather than let the heap reach twice its live data,\nand the default of --batches-in-flight fits in it; GOMEMLIMIT in the\nenvironment wins over auto")
}

// apply sets the limit, and logs it with where it came from; cacheBytes
// is the cache's budget (--cache-bytes), which auto's limit outside a
// container leaves room for.
func (m *memoryLimit) apply(log *slog.Logger, cacheBytes int64) {
	switch {
	case m.off:
		debug.SetMemoryLimit(math.MaxInt64)
		if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
			log.Info("memory limit off (--memory-limit off overrides GOMEMLIMIT)")
			return
		}
		log.Info("memory limit off")
	case !m.auto:
		debug.SetMemoryLimit(int64(m.bytes))
		log.Info("memory limit", "limit", m.bytes.String(), "from", "--memory-limit")
	default:
		if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
			log.Info("memory limit", "limit", v, "from", "GOMEMLIMIT")
			return
		}
		b, from, container := autoMemoryLimit(cacheBytes, "/proc/self/cgroup", "/sys/fs/cgroup")
		if container == 0 && m.noDefault {
			log.Info("memory limit none: no container limit found (set --memory-limit to bound the heap)")
			return
		}
		debug.SetMemoryLimit(b)
		lb, cb := byteSize(b), byteSize(container)
		if container == 0 {
			log.Info("memory limit", "limit", lb.String(), "from", from)
			return
		}
		log.Info("memory limit", "limit", lb.String(), "from", from, "container_limit", cb.String())
	}
}

// autoMemoryLimit is --memory-limit auto's limit: memoryShare of the
// container's limit (container, read from the cgroup files under
// procCgroup and root), or, with none found, the cache's budget and a
// working part (container 0). from says which, for the log.
func autoMemoryLimit(cacheBytes int64, procCgroup, root string) (limit int64, from string, container int64) {
	c, path, ok := containerMemoryLimit(procCgroup, root)
	if !ok {
		working := byteSize(projection.WorkingMemory)
		return projection.DefaultMemoryLimit(cacheBytes), "--cache-bytes + " + working.String() + " (no container limit found; --memory-limit sets another)", 0
	}
	return int64(float64(c) * memoryShare), path, c
}

// containerMemoryLimit reads the memory limit of the cgroup this process
// is in: the smallest of cgroup v2's memory.max from its cgroup up to the
// hierarchy's root (a limit set on a parent bounds its children too), else
// v1's memory.limit_in_bytes the same way. ok is false without a limit
// ("max", or v1's page-rounded "unlimited" value, all the way up).
func containerMemoryLimit(procCgroup, root string) (limit int64, path string, ok bool) {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	type hierarchy struct{ dir, cgroup, file string }
	var found []hierarchy
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			found = append(found, hierarchy{root, parts[2], "memory.max"})
		case hasController(parts[1], "memory"):
			found = append(found, hierarchy{filepath.Join(root, "memory"), parts[2], "memory.limit_in_bytes"})
		}
	}
	for _, h := range found {
		// From the process's cgroup up to the root of its mount: a
		// container's namespace may show its own cgroup as the root.
		cg := filepath.Clean("/" + h.cgroup)
		for {
			c := filepath.Join(h.dir, cg, h.file)
			if n, set := readLimit(c); set && (!ok || n < limit) {
				limit, path, ok = n, c, true
			}
			if cg == "/" {
				break
			}
			cg = filepath.Dir(cg)
		}
		if ok {
			return limit, path, true
		}
	}
	return 0, "", false
}

// readLimit reads one cgroup limit file; set is false for none ("max",
// v1's unlimited value) or a file that cannot be read.
func readLimit(path string) (n int64, set bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false
	}
	n, err = strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		// v1 says "no limit" with a huge page-rounded number.
		return 0, false
	}
	return n, true
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
