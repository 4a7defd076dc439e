package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

var quarantineCommand = &command{
	name:    "quarantine",
	summary: "list, show, replay and purge quarantined records",
	usage: `projector quarantine reads and manages the records the projection refused:
input that broke the wire format, deltas whose ops did not fit the state, and
records PostgreSQL refused for their data (for example a CHECK constraint on
the read model). Each record keeps its topic, partition, offset, key, value
and reason, under an id the commands below take.`,
	subs: []*command{quarantineListCommand, quarantineShowCommand, quarantineReplayCommand, quarantinePurgeCommand},
}

// quarantineEntry is one record as list and show print it in JSON.
type quarantineEntry struct {
	ID        int64  `json:"id"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	Key       string `json:"key"`
	// KeyBase64 carries the key's exact bytes when they are not valid
	// UTF-8: JSON strings cannot, and key then has each invalid byte
	// replaced by U+FFFD, so two different keys could print alike.
	KeyBase64   string    `json:"key_base64,omitempty"`
	Error       string    `json:"error"`
	Time        time.Time `json:"time"`
	Value       *string   `json:"value,omitempty"`
	ValueBase64 string    `json:"value_base64,omitempty"`
}

func entryOf(q store.QuarantineRecord, withValue bool) quarantineEntry {
	e := quarantineEntry{ID: q.ID, Topic: q.Topic, Partition: q.Partition, Offset: q.Offset,
		Key: string(q.Key), Error: q.Error, Time: q.Time.UTC()}
	if !utf8.Valid(q.Key) {
		e.KeyBase64 = base64.StdEncoding.EncodeToString(q.Key)
	}
	if withValue {
		v := string(q.Value)
		e.Value = &v
		if !utf8.Valid(q.Value) {
			e.ValueBase64 = base64.StdEncoding.EncodeToString(q.Value)
		}
	}
	return e
}

type quarantineListOpts struct {
	store storeFlags
	json  bool
	limit int
	since timeFlag
}

var quarantineListCommand = &command{
	name:    "quarantine list",
	summary: "the quarantined records, newest first",
	usage: `projector quarantine list prints the quarantined records, newest first: id,
time, where each was read, its key and why it was refused. It only reads.

Example:
  projector quarantine list --since 24h --limit 20`,
	flags: func(fs *flag.FlagSet) any {
		o := &quarantineListOpts{}
		o.store.register(fs)
		fs.BoolVar(&o.json, "json", false, "print a JSON array instead of a table")
		fs.IntVar(&o.limit, "limit", 100, "most records to print; 0 prints all")
		fs.Var(&o.since, "since", "only records quarantined at or after this time: 2026-11-30T09:00:00Z,\n2026-11-30, or a duration back from now such as 24h")
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*quarantineListOpts)
		if o.limit < 0 {
			return usagef("--limit %d: must not be negative (0 prints all)", o.limit)
		}
		st, err := openProjection(ctx, o.store.databaseURL, o.store.config(), existing)
		if err != nil {
			return err
		}
		defer st.Close()
		recs, err := st.QuarantineRecords(ctx, store.QuarantineFilter{Since: o.since.t, Limit: o.limit})
		if err != nil {
			return err
		}
		if o.json {
			out := make([]quarantineEntry, 0, len(recs))
			for _, q := range recs {
				out = append(out, entryOf(q, false))
			}
			return printJSON(env, out)
		}
		if len(recs) == 0 {
			fmt.Fprintln(env.stdout, "no quarantined records")
			return nil
		}
		w := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tTIME\tTOPIC/PARTITION@OFFSET\tKEY\tERROR")
		for _, q := range recs {
			fmt.Fprintf(w, "%d\t%s\t%s/%d@%d\t%s\t%s\n", q.ID, q.Time.UTC().Format(time.RFC3339), printable(q.Topic),
				q.Partition, q.Offset, printable(string(q.Key)), printable(q.Error))
		}
		return w.Flush()
	},
}

type quarantineShowOpts struct {
	store storeFlags
	json  bool
}

var quarantineShowCommand = &command{
	name:    "quarantine show",
	summary: "one quarantined record in full, value included",
	args:    "ID",
	usage: `projector quarantine show prints one quarantined record in full: where it was
read, its key, its value and why it was refused. It only reads.

Example:
  projector quarantine show 42`,
	flags: func(fs *flag.FlagSet) any {
		o := &quarantineShowOpts{}
		o.store.register(fs)
		fs.BoolVar(&o.json, "json", false, "print a JSON object instead of text")
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*quarantineShowOpts)
		if len(env.args) != 1 {
			return usagef("want one quarantined record id, e.g. projector quarantine show 42 (ids are in projector quarantine list)")
		}
		ids, err := parseIDs(env.args)
		if err != nil {
			return err
		}
		st, err := openProjection(ctx, o.store.databaseURL, o.store.config(), existing)
		if err != nil {
			return err
		}
		defer st.Close()
		recs, err := st.QuarantineRecords(ctx, store.QuarantineFilter{IDs: ids})
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return fmt.Errorf("no quarantined record with id %d in %s.%s", ids[0], o.store.schema, o.store.table)
		}
		q := recs[0]
		if o.json {
			return printJSON(env, entryOf(q, true))
		}
		w := tabwriter.NewWriter(env.stdout, 0, 4, 1, ' ', 0)
		fmt.Fprintf(w, "id:\t%d\n", q.ID)
		fmt.Fprintf(w, "time:\t%s\n", q.Time.UTC().Format(time.RFC3339Nano))
		fmt.Fprintf(w, "read at:\t%s/%d@%d\n", printable(q.Topic), q.Partition, q.Offset)
		fmt.Fprintf(w, "key:\t%s\n", printable(string(q.Key)))
		fmt.Fprintf(w, "error:\t%s\n", printable(q.Error))
		value := printable(string(q.Value))
		if q.Value == nil {
			value = "(null: a tombstone)"
		}
		fmt.Fprintf(w, "value:\t%s\n", value)
		return w.Flush()
	},
}

type quarantineReplayOpts struct {
	store storeFlags
	all   bool
	json  bool
}

var quarantineReplayCommand = &command{
	name:    "quarantine replay",
	summary: "run quarantined records again through today's decoder and version rules",
	args:    "ID... | --all",
	usage: `projector quarantine replay runs quarantined records again, in the order they
were quarantined, through today's decoder and version rules, and writes them
with the same version-conditional statements as live records. Records that
apply, and records the row already covers (stale, duplicate, or a conflict the
row wins), leave the quarantine; records that are still refused stay, one row
each, with their reason updated. A delta whose previous versions are not in the
row yet stays too, its reason naming the versions it waits for.

It is safe while 'projector run' runs: it never moves a partition's position or
epoch, and a row that moves under a record is read again before it is decided.
It prints the counts and exits 0 whatever each record's fate.

Example, after dropping a constraint that refused records:
  projector quarantine replay --all`,
	flags: func(fs *flag.FlagSet) any {
		o := &quarantineReplayOpts{}
		o.store.register(fs)
		fs.BoolVar(&o.all, "all", false, "replay every quarantined record of the projection")
		fs.BoolVar(&o.json, "json", false, "print the counts as JSON")
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*quarantineReplayOpts)
		if o.all == (len(env.args) > 0) {
			return usagef("give quarantined record ids or --all, not both and not neither (ids are in projector quarantine list)")
		}
		ids, err := parseIDs(env.args)
		if err != nil {
			return err
		}
		st, err := openProjection(ctx, o.store.databaseURL, o.store.config(), existing)
		if err != nil {
			return err
		}
		defer st.Close()
		if o.all {
			if ids, err = st.QuarantineIDs(ctx); err != nil {
				return err
			}
		} else {
			recs, err := st.QuarantineRecords(ctx, store.QuarantineFilter{IDs: ids})
			if err != nil {
				return err
			}
			found := map[int64]bool{}
			for _, q := range recs {
				found[q.ID] = true
			}
			for _, id := range ids {
				if !found[id] {
					return fmt.Errorf("no quarantined record with id %d in %s.%s; nothing replayed", id, o.store.schema, o.store.table)
				}
			}
		}
		rep, err := projection.Replay(ctx, st, ids)
		if err != nil {
			return fmt.Errorf("%w (counts so far: %s)", err, replaySummary(rep))
		}
		if o.json {
			return printJSON(env, struct {
				projection.ReplayReport
				Left   int `json:"left_quarantine"`
				Stayed int `json:"stayed"`
			}{rep, rep.Left(), rep.Refused + rep.Waiting})
		}
		fmt.Fprintf(env.stdout, "replayed %d quarantined records: %s\n", rep.Replayed, replaySummary(rep))
		return nil
	},
}

func replaySummary(r projection.ReplayReport) string {
	return fmt.Sprintf("%d applied, %d stale, %d duplicates, %d conflicts left the quarantine; %d still refused and %d waiting for earlier versions stay",
		r.Applied, r.Stale, r.Duplicates, r.Conflicts, r.Refused, r.Waiting)
}

type quarantinePurgeOpts struct {
	store  storeFlags
	before timeFlag
	all    bool
}

var quarantinePurgeCommand = &command{
	name:    "quarantine purge",
	summary: "delete quarantined records for good",
	usage: `projector quarantine purge deletes quarantined records for good: those
quarantined before --before, or every one with --all. The records' bytes are
gone afterwards; replay or copy what you still need first.

Example:
  projector quarantine purge --before 720h`,
	flags: func(fs *flag.FlagSet) any {
		o := &quarantinePurgeOpts{}
		o.store.register(fs)
		fs.Var(&o.before, "before", "delete records quarantined before this time: 2026-11-30T09:00:00Z,\n2026-11-30, or a duration back from now such as 720h")
		fs.BoolVar(&o.all, "all", false, "delete every quarantined record of the projection")
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*quarantinePurgeOpts)
		if o.all == o.before.set {
			return usagef("give --before TIME or --all, not both and not neither")
		}
		st, err := openProjection(ctx, o.store.databaseURL, o.store.config(), existing)
		if err != nil {
			return err
		}
		defer st.Close()
		n, err := st.PurgeQuarantine(ctx, o.before.t)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "purged %d quarantined records\n", n)
		return nil
	},
}

func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return nil, usagef("%q is not a quarantined record id: ids are positive whole numbers, listed by projector quarantine list", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func printJSON(env *cmdEnv, v any) error {
	enc := json.NewEncoder(env.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
