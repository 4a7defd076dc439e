package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/projector/projector/projection"
)

type explainOpts struct {
	store storeFlags
	json  bool
	gaps  int
}

var explainCommand = &command{
	name:    "explain",
	summary: "one job: its row, its held deltas and why, its recent gaps",
	args:    "JOB_ID",
	usage: `projector explain answers "why does this job look like that?": the job's row in
the read model (version, state, when and from where it was last written), the
deltas held behind a gap with the versions they wait for and the attempts made
to close it (attempts, last step and its error), and the job's recent gaps from
the gap log (when each opened and closed, by which step, and the versions).

It only reads. A job that is neither in the read model nor held exits 1.

Example:
  projector explain job-42 --json`,
	flags: func(fs *flag.FlagSet) any {
		o := &explainOpts{}
		o.store.register(fs)
		fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
		fs.IntVar(&o.gaps, "gaps", projection.DefaultExplainGaps, "most recent gap log entries to show")
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*explainOpts)
		if len(env.args) != 1 || env.args[0] == "" {
			return usagef("want one job id, e.g. projector explain job-42 (a job id that starts with - goes after --)")
		}
		if o.gaps < 0 {
			return usagef("--gaps %d: must not be negative", o.gaps)
		}
		job := env.args[0]
		st, err := openProjection(ctx, o.store.databaseURL, o.store.config(), existing)
		if err != nil {
			return err
		}
		defer st.Close()
		ex, err := st.Explain(ctx, job, o.gaps)
		if err != nil {
			return err
		}
		if !projection.Known(ex) {
			return fmt.Errorf("job %s is neither in %s.%s nor held nor deleted", strconv.QuoteToGraphic(job), o.store.schema, o.store.table)
		}
		rep := projection.ExplanationOf(job, ex)
		if o.json {
			return printJSON(env, rep)
		}
		printExplain(env, o.store, rep)
		return nil
	},
}

func printExplain(env *cmdEnv, sf storeFlags, rep *projection.Explanation) {
	w := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "job %s in %s.%s\n", printable(rep.JobID), sf.schema, sf.table)
	switch t := rep.Tombstone; {
	case t != nil:
		fmt.Fprintf(w, "  deleted\tat version %d, %s\n", t.Version, t.DeletedAt.UTC().Format(time.RFC3339Nano))
		fmt.Fprintf(w, "  written from\t%s\n", sourceText(&projection.ExplainSource{Topic: t.Topic, Partition: t.Partition, Offset: t.Offset, EventID: t.EventID}))
		fmt.Fprintln(w, "  (a tombstone: no row; events at or below this version cannot bring the job back)")
	case rep.Updated == nil:
		fmt.Fprintln(w, "  no row: the job has only held deltas")
	default:
		fmt.Fprintf(w, "  version\t%d\n", rep.Version)
		fmt.Fprintf(w, "  updated\t%s\n", rep.Updated.Format(time.RFC3339Nano))
		fmt.Fprintf(w, "  written from\t%s\n", sourceText(rep.Source))
		fmt.Fprintf(w, "  state\t%s\n", printable(string(rep.State)))
	}
	if len(rep.Held) == 0 {
		fmt.Fprintln(w, "\nheld deltas: none")
	} else {
		fmt.Fprintf(w, "\nheld deltas: %d, waiting for versions %s\n", len(rep.Held), versions(rep.WaitingFor))
		if t := rep.Tombstone; t != nil {
			fmt.Fprintf(w, "  (the job is deleted at version %d: the held deltas wait for a snapshot above version %d to create it again;\n"+
				"  a delta at version %d has no state to change and goes to the quarantine)\n", t.Version, t.Version, t.Version+1)
		}
		fmt.Fprintln(w, "  VERSION\tREAD AT\tHELD SINCE\tWAITS FOR\tATTEMPTS\tLAST STEP\tLAST ATTEMPT\tLAST ERROR")
		for _, h := range rep.Held {
			last := "-"
			if h.LastAttempt != nil {
				last = h.LastAttempt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "  %d\t%s/%d@%d\t%s\t%s\t%d\t%s\t%s\t%s\n", h.Version, printable(h.Topic), h.Partition, h.Offset,
				h.Since.UTC().Format(time.RFC3339), versions(h.WaitingFor), h.Attempts, orDash(h.LastStep), last, orDash(printable(h.LastError)))
		}
	}
	if len(rep.Gaps) == 0 {
		fmt.Fprintln(w, "\nrecent gaps: none in the gap log")
		return
	}
	fmt.Fprintf(w, "\nrecent gaps (newest first): %d\n", len(rep.Gaps))
	fmt.Fprintln(w, "  OPENED\tCLOSED\tBY\tVERSIONS\tHELD\tATTEMPTS\tPARTITION")
	for _, g := range rep.Gaps {
		part := "-"
		if g.Partition != nil {
			part = fmt.Sprintf("%s/%d", printable(g.Topic), *g.Partition)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%d -> %d\t%s\t%d\t%s\n", g.Opened.UTC().Format(time.RFC3339), g.Closed.UTC().Format(time.RFC3339),
			g.Step, g.From, g.To, versions(g.Held), g.Attempts, part)
	}
}

func sourceText(s *projection.ExplainSource) string {
	switch {
	case s == nil:
		return "-"
	case s.Topic == "" && s.Offset != nil && *s.Offset < 0:
		return "the trusted snapshot endpoint (projector verify --repair)"
	case s.Topic == "":
		return "-"
	}
	at := printable(s.Topic)
	if s.Partition != nil {
		at += fmt.Sprintf("/%d", *s.Partition)
	}
	if s.Offset != nil {
		if *s.Offset < 0 {
			at += " (the trusted snapshot endpoint)"
		} else {
			at += fmt.Sprintf("@%d", *s.Offset)
		}
	}
	if s.EventID != "" {
		at += ", event " + printable(s.EventID)
	}
	return at
}

func versions(vs []int64) string {
	if len(vs) == 0 {
		return "-"
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
