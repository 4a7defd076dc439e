package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/projector/projector/projection"
)

type versionOpts struct{ json bool }

var versionCommand = &command{
	name:    "version",
	summary: "the module version and VCS revision this binary was built from",
	usage: `projector version prints the module version and the VCS revision (commit,
its time, and whether the working tree was modified) recorded in the binary
by the Go toolchain, and the Go version. A binary built outside a git
checkout, or with -buildvcs=false, has no revision.

Example:
  projector version --json`,
	flags: func(fs *flag.FlagSet) any {
		o := &versionOpts{}
		fs.BoolVar(&o.json, "json", false, "print JSON")
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		b := projection.Build()
		if opts.(*versionOpts).json {
			enc := json.NewEncoder(env.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(b)
		}
		rev := b.Revision
		if rev == "" {
			rev = "unknown (built without VCS information)"
		} else if b.Modified {
			rev += " (modified)"
		}
		fmt.Fprintf(env.stdout, "projector %s\nrevision %s\n", b.Version, rev)
		if b.Time != "" {
			fmt.Fprintf(env.stdout, "committed %s\n", b.Time)
		}
		fmt.Fprintf(env.stdout, "built with %s\n", b.GoVersion)
		return nil
	},
}
