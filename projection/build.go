package projection

import (
	"runtime"
	"runtime/debug"
)

// BuildInfo is what the running binary was built from, as the Go toolchain
// recorded it.
type BuildInfo struct {
	// Version is the main module's version: a tag such as v1.2.0, a
	// pseudo-version, or "(devel)" for a build from a working tree.
	Version string `json:"version"`
	// Revision is the VCS commit, Time its time, and Modified whether the
	// working tree had changes; empty when built without VCS information
	// (go run, -buildvcs=false, or a source tree with no .git).
	Revision  string `json:"revision"`
	Time      string `json:"time,omitempty"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go_version"`
}

// Build reads the binary's build information.
func Build() BuildInfo {
	b := BuildInfo{Version: "unknown", GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if info.Main.Version != "" {
		b.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}
