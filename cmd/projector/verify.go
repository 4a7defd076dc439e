package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/projector/projector/snapshot"
	"github.com/projector/projector/store"
	"github.com/projector/projector/verify"
)

type verifyOpts struct {
	store       storeFlags
	snapshotURL string
	all         bool
	sample      int
	jobs        jobsFlag
	repair      bool
	rate        int
	json        bool
}

var verifyCommand = &command{
	name:    "verify",
	summary: "compare rows with the trusted authority; --repair heals the drift",
	usage: `projector verify asks the trusted snapshot authority (GET {url}/jobs/{job_id})
for jobs and compares each with its row in the read model. It reports each
drift with the job id and its kind:

  missing   the authority knows the job, the read model has no row
  behind    the row's version is below the authority's
  ahead     the row's version is above the authority's (never repaired)
  differs   same version, other state

A deleted job counts by its tombstone's version, and the authority may answer
that a job was deleted (410 Gone, or a delete record): a delete the read model
has no trace of is no drift.

--all checks every row, every tombstone and every job held without a row,
--sample N a random N of them, --job the jobs named (the only way to find rows missing
altogether). --repair heals missing, behind and differs with the authority's
snapshot, through a statement that never lowers a version; each repair is
written to the gap log (step verify). Jobs the authority does not know (404)
are listed, not counted as drift. Repairs are safe while 'projector run'
runs: a same-version rewrite (differs) marks the row's event_id, on which a
running instance's next update is conditioned, so it reloads the repair.
Do not repair while 'projector rebuild' of the table runs: the swap replaces
rows with the rebuilt ones, which never saw the repair.

Exit codes: 0 no drift remains, 3 drift remains (after --repair: what was not
healed, such as ahead), 1 the check itself failed (store, or authority errors
for some jobs), 2 bad usage.

Example:
  projector verify --snapshot-url http://authority:8080 --sample 500
  projector verify --snapshot-url http://authority:8080 --job job-42,job-43 --repair`,
	flags: func(fs *flag.FlagSet) any {
		o := &verifyOpts{}
		o.store.register(fs)
		fs.StringVar(&o.snapshotURL, "snapshot-url", "", "the trusted snapshot authority, e.g. http://authority:8080 (required)")
		fs.BoolVar(&o.all, "all", false, "check every row of the read model and every job held without a row")
		fs.IntVar(&o.sample, "sample", 0, "check this many rows picked at random")
		fs.Var(&o.jobs, "job", "check these jobs: --job a,b, --job a --job b, or --job a followed by more ids")
		fs.BoolVar(&o.repair, "repair", false, "heal missing, behind and differs with the authority's snapshot")
		fs.IntVar(&o.rate, "rate", 50, "most requests to the authority per second")
		fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
		return o
	},
	args: "[JOB_ID...]",
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*verifyOpts)
		if len(env.args) > 0 && len(o.jobs) == 0 {
			return usagef("job ids %q without --job: name the jobs to check with --job, e.g. --job %s", env.args, env.args[0])
		}
		o.jobs = append(o.jobs, env.args...)
		if err := o.validate(); err != nil {
			return err
		}
		client, err := snapshot.NewClient(o.snapshotURL)
		if err != nil {
			return usagef("--snapshot-url: %v", err)
		}
		st, err := openProjection(ctx, o.store.databaseURL, o.store.config(), existing)
		if err != nil {
			return err
		}
		defer st.Close()
		rep, err := verify.Run(ctx, verify.Config{Store: st, Authority: client, Repair: o.repair, Rate: o.rate}, o.pages(st))
		if err != nil {
			return err
		}
		if o.json {
			if err := printJSON(env, rep); err != nil {
				return err
			}
		} else {
			printVerify(env, o, rep)
		}
		switch {
		case rep.Remaining > 0:
			return &codeError{exitDrift, fmt.Sprintf("drift remains (%d jobs): exit 3", rep.Remaining)}
		case len(rep.Failed) > 0:
			return fmt.Errorf("%d jobs could not be checked: the authority failed (first: %s)", len(rep.Failed), rep.Failed[0].Error)
		}
		return nil
	},
}

// jobsFlag collects job ids from every --job, each a comma-separated list.
type jobsFlag []string

func (j *jobsFlag) String() string { return strings.Join(*j, ",") }

func (j *jobsFlag) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*j = append(*j, part)
		}
	}
	return nil
}

func (o *verifyOpts) validate() error {
	chosen := 0
	if o.all {
		chosen++
	}
	if o.sample != 0 {
		chosen++
	}
	if len(o.jobs) > 0 {
		chosen++
	}
	switch {
	case o.snapshotURL == "":
		return usagef("--snapshot-url is required: the trusted authority to compare with, e.g. http://authority:8080")
	case chosen != 1:
		return usagef("say which jobs to check with exactly one of --all, --sample N or --job ID[,ID...]")
	case o.sample < 0:
		return usagef("--sample %d: must be positive", o.sample)
	case o.rate <= 0 || o.rate > 100_000:
		return usagef("--rate %d: must be from 1 to 100000 (requests per second)", o.rate)
	}
	return nil
}

// pages yields the job ids to check, a page at a time.
func (o *verifyOpts) pages(st *store.Store) func(ctx context.Context) ([]string, error) {
	const page = 1000
	switch {
	case len(o.jobs) > 0:
		done := false
		return func(context.Context) ([]string, error) {
			if done {
				return nil, nil
			}
			done = true
			return o.jobs, nil
		}
	case o.sample > 0:
		done := false
		return func(ctx context.Context) ([]string, error) {
			if done {
				return nil, nil
			}
			done = true
			return st.SampleJobIDs(ctx, o.sample)
		}
	}
	// Rows, then tombstones, a page at a time; then the jobs held without
	// either.
	after, stage := "", 0
	return func(ctx context.Context) ([]string, error) {
		for stage < 2 {
			list := st.JobIDs
			if stage == 1 {
				list = st.DeletedJobIDs
			}
			ids, err := list(ctx, after, page)
			if err != nil || len(ids) > 0 {
				if len(ids) > 0 {
					after = ids[len(ids)-1]
				}
				return ids, err
			}
			stage, after = stage+1, ""
		}
		if stage == 2 {
			stage++
			return st.HeldWithoutRow(ctx)
		}
		return nil, nil
	}
}

func printVerify(env *cmdEnv, o *verifyOpts, rep *verify.Report) {
	w := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "checked %d jobs of %s.%s against the authority; drifts: %d (missing %d, behind %d, ahead %d, differs %d)\n",
		rep.Checked, o.store.schema, o.store.table, len(rep.Drifts),
		rep.Counts[verify.Missing], rep.Counts[verify.Behind], rep.Counts[verify.Ahead], rep.Counts[verify.Differs])
	if len(rep.Drifts) > 0 {
		fmt.Fprintln(w, "JOB\tKIND\tROW VERSION\tAUTHORITY VERSION\tREPAIRED")
		for _, d := range rep.Drifts {
			repaired := "no"
			switch {
			case d.Repaired:
				repaired = "yes"
			case d.Kind == verify.Ahead:
				repaired = "no (ahead is never touched)"
			case !o.repair:
				repaired = "no (--repair not given)"
			}
			if d.Note != "" {
				repaired += ": " + d.Note
			}
			rowV, authV := fmt.Sprint(d.RowVersion), fmt.Sprint(d.AuthorityVersion)
			if d.RowDeleted {
				rowV += " (deleted)"
			}
			if d.AuthorityDeleted {
				authV += " (deleted)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", printable(d.JobID), d.Kind, rowV, authV, repaired)
		}
	}
	if o.repair {
		fmt.Fprintf(w, "repaired: %d; drifts remaining: %d\n", rep.Repaired, rep.Remaining)
	}
	if len(rep.Unknown) > 0 {
		fmt.Fprintf(w, "unknown to the authority (404), not counted as drift: %d\n", len(rep.Unknown))
		for _, id := range rep.Unknown {
			fmt.Fprintf(w, "  %s\n", printable(id))
		}
	}
	if len(rep.Failed) > 0 {
		fmt.Fprintf(w, "could not be checked: %d\n", len(rep.Failed))
		for _, f := range rep.Failed {
			fmt.Fprintf(w, "  %s\t%s\n", printable(f.JobID), printable(f.Error))
		}
	}
}
