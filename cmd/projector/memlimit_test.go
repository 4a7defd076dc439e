package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/projector/projector/projection"
	"github.com/stretchr/testify/require"
)

// TestContainerMemoryLimit reads a cgroup v2 memory.max, a v1
// memory.limit_in_bytes, and says there is none for "max", v1's unlimited
// value, or no cgroup file at all.
func TestContainerMemoryLimit(t *testing.T) {
	t.Parallel()
	write := func(t *testing.T, path, content string) {
		t.Helper()
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	}
	for _, tc := range []struct {
		name, cgroup, file, content string
		want                        int64
		ok                          bool
	}{
		{"v2 limit", "0::/kubepods/pod1/c1\n", "kubepods/pod1/c1/memory.max", "536870912\n", 536870912, true},
		{"v2 max", "0::/kubepods/pod1/c1\n", "kubepods/pod1/c1/memory.max", "max\n", 0, false},
		{"v1 limit", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", "memory/docker/abc/memory.limit_in_bytes", "268435456\n", 268435456, true},
		{"v1 unlimited", "4:cpuacct,memory:/docker/abc\n", "memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n", 0, false},
		{"v1 at the root of its mount", "4:memory:/docker/abc\n", "memory/memory.limit_in_bytes", "1073741824\n", 1073741824, true},
		{"no file", "0::/x\n", "elsewhere", "1", 0, false},
		{"v2 limit on a parent", "0::/init\n", "memory.max", "536870912\n", 536870912, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "cgroup"), tc.cgroup)
			write(t, filepath.Join(dir, "fs", tc.file), tc.content)
			got, _, ok := containerMemoryLimit(filepath.Join(dir, "cgroup"), filepath.Join(dir, "fs"))
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestMemoryLimitFlag: auto by default, off, a size; anything else is
// refused with what to write.
func TestMemoryLimitFlag(t *testing.T) {
	t.Parallel()
	var m memoryLimit
	require.Equal(t, "auto", m.String())
	require.NoError(t, m.Set("off"))
	require.Equal(t, "off", m.String())
	require.NoError(t, m.Set("400MiB"))
	require.Equal(t, "400MiB", m.String())
	require.NoError(t, m.Set("auto"))
	require.Equal(t, "auto", m.String())
	require.NoError(t, m.Set("0MiB"))
	require.Equal(t, "off", m.String(), "a zero size is off, never a limit of nothing")
	require.ErrorContains(t, m.Set("1KiB"), "below")
	err := m.Set("lots")
	require.ErrorContains(t, err, "want auto, off or a size")
}

// TestAutoMemoryLimitLeavesTheCacheItsRoom: auto takes 85% of a
// container's limit; with none, the cache's budget and 144 MiB, so that
// a larger --cache-bytes raises the limit with it.
func TestAutoMemoryLimitLeavesTheCacheItsRoom(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cgroup := filepath.Join(dir, "cgroup")
	require.NoError(t, os.WriteFile(cgroup, []byte("0::/pod/c1\n"), 0o644))
	fs := filepath.Join(dir, "fs")

	got, from, container := autoMemoryLimit(64<<20, cgroup, fs)
	require.Equal(t, int64(208<<20), got, "no container: the default cache and 144 MiB")
	require.Zero(t, container)
	require.Contains(t, from, "--cache-bytes + 144MiB")
	got, _, _ = autoMemoryLimit(1<<30, cgroup, fs)
	require.Equal(t, int64(1<<30+144<<20), got, "the limit follows --cache-bytes")

	require.NoError(t, os.MkdirAll(filepath.Join(fs, "pod", "c1"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(fs, "pod", "c1", "memory.max"), []byte("536870912\n"), 0o644))
	got, from, container = autoMemoryLimit(64<<20, cgroup, fs)
	require.Equal(t, int64(536870912), container)
	pod := int64(536870912)
	require.Equal(t, int64(float64(pod)*0.85), got, "in a container: 85% of its limit, whatever the cache")
	require.Contains(t, from, "memory.max")
}

// projector run sets its memory limit before it builds the engine, so the
// default of batches in flight fits in it, and says the bound it took.
func TestRunSizesItsBatchesInFlightToItsMemoryLimit(t *testing.T) {
	t.Parallel()
	s := newStory(t, 2)
	for _, c := range []struct {
		limit string
		want  int
	}{
		{"300MiB", 5}, // (300 - 64) MiB / (5,000 records x 9 KiB)
		{"off", projection.DefaultBatchesInFlight()},
	} {
		p := startBin(t, "run", dbEnv(), s.runArgs("g-inflight-"+c.limit, "inst-"+c.limit, "--memory-limit", c.limit)...)
		eventually(t, 15*time.Second, "the bound is logged", func() (bool, string) {
			p.requireAlive()
			return p.logged("batches in flight", map[string]string{"bound": fmt.Sprint(c.want)}), p.logs.String()
		})
		p.stop(15 * time.Second)
	}
}

// projector rebuild's --memory-limit keeps its "no default where no
// container limit is found" through whatever the flag is set to.
func TestRebuildMemoryLimitKeepsNoDefault(t *testing.T) {
	t.Parallel()
	m := memoryLimit{auto: true, noDefault: true}
	for _, v := range []string{"off", "400MiB", "0", "auto"} {
		require.NoError(t, m.Set(v))
		require.True(t, m.noDefault, "after %q", v)
	}
	require.Equal(t, "auto", m.String())
}
