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
)

// memoryLimit is --memory-limit: the Go runtime's soft memory limit
// (debug.SetMemoryLimit). "auto" (the default) takes memoryShare of the
// container's memory limit when there is one (cgroup v2 memory.max, or v1
// memory.limit_in_bytes), and sets none otherwise; "off" sets none; a size
// sets that. Near the limit the garbage collector runs more often instead of
// letting the heap reach twice its live data, which is what keeps a pod
// under its limit; it is soft, so a live heap above it is not refused, only
// collected harder.
type memoryLimit struct {
	auto, off bool
	bytes     byteSize
}

// memoryShare is the part of a container's limit the Go heap may use:
// the rest is left to goroutine stacks, pgx's and the fetchers' buffers
// outside the heap, and the runtime's own.
const memoryShare = 0.85

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
	*m = memoryLimit{bytes: b}
	return nil
}

// Get makes it a flag.Getter.
func (m *memoryLimit) Get() any { return m.String() }

// register adds --memory-limit to fs.
func (m *memoryLimit) register(fs *flag.FlagSet) {
	*m = memoryLimit{auto: true}
	fs.Var(m, "memory-limit", "the Go runtime's soft memory limit: a `size` (400MiB), off, or auto: 85% of\nthe container's memory limit (cgroup memory.max), none outside a container.\nNear it the garbage collector works harder rather than let the heap reach\ntwice its live data; GOMEMLIMIT in the environment wins over auto")
}

// apply sets the limit, and logs it with where it came from.
func (m *memoryLimit) apply(log *slog.Logger) {
	switch {
	case m.off:
		debug.SetMemoryLimit(math.MaxInt64)
		log.Info("memory limit off")
	case !m.auto:
		debug.SetMemoryLimit(int64(m.bytes))
		log.Info("memory limit", "limit", m.bytes.String(), "from", "--memory-limit")
	default:
		if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
			log.Info("memory limit", "limit", v, "from", "GOMEMLIMIT")
			return
		}
		limit, path, ok := containerMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup")
		if !ok {
			log.Info("memory limit none: no container limit found (set --memory-limit to bound the heap)")
			return
		}
		b := byteSize(float64(limit) * memoryShare)
		debug.SetMemoryLimit(int64(b))
		c := byteSize(limit)
		log.Info("memory limit", "limit", b.String(), "from", path, "container_limit", c.String())
	}
}

// containerMemoryLimit reads the memory limit of the cgroup this process
// is in: cgroup v2's memory.max, else v1's memory.limit_in_bytes. ok is
// false without a limit ("max", or v1's page-rounded "unlimited" value).
func containerMemoryLimit(procCgroup, root string) (limit int64, path string, ok bool) {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	var candidates []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			candidates = append(candidates,
				filepath.Join(root, parts[2], "memory.max"),
				filepath.Join(root, "memory.max"))
		case hasController(parts[1], "memory"):
			candidates = append(candidates,
				filepath.Join(root, "memory", parts[2], "memory.limit_in_bytes"),
				filepath.Join(root, "memory", "memory.limit_in_bytes"))
		}
	}
	for _, c := range candidates {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, c, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= 1<<62 {
			// v1 says "no limit" with a huge page-rounded number.
			return 0, c, false
		}
		return n, c, true
	}
	return 0, "", false
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
