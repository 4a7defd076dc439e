package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/projector/projector/store"
)

type migrateOpts struct {
	databaseURL string
	schema      string
	table       string
}

var migrateCommand = &command{
	name:    "migrate",
	summary: "create the projection's tables or bring them up to this version, as their owner",
	usage: `projector migrate creates the projection's tables (the read model and the
projector's own) in --schema, or runs the migrations this version has that they
have not had, and prints which. It is idempotent and safe while instances run:
migrations hold an advisory lock keyed by the schema, and each adds what it
needs without rewriting what is there.

Run it in a deploy step as the role that owns the tables; 'run' then needs only
SELECT, INSERT, UPDATE and DELETE on the tables and USAGE on their sequences
(docs/deploy.md lists the grants). A 'run' whose tables are behind and whose
role may not migrate them exits 1 naming this command.

Example:
  DATABASE_URL=postgres://owner@db:5432/app projector migrate --schema public --table jobs`,
	flags: func(fs *flag.FlagSet) any {
		o := &migrateOpts{}
		registerStoreFlags(fs, &o.databaseURL, &o.schema, &o.table)
		return o
	},
	run: func(ctx context.Context, env *cmdEnv, opts any) error {
		o := opts.(*migrateOpts)
		st, err := openProjection(ctx, o.databaseURL, store.Config{Schema: o.schema, Table: o.table}, unchecked)
		if err != nil {
			return err
		}
		defer st.Close()
		pending, err := st.Pending(ctx)
		if err != nil {
			return err
		}
		if len(pending) == 0 {
			fmt.Fprintf(env.stdout, "%s.%s is up to date: nothing to migrate\n", o.schema, o.table)
			return nil
		}
		if err := st.Migrate(ctx); err != nil {
			return err
		}
		names := make([]string, len(pending))
		for i, p := range pending {
			names[i] = store.MigrationName(p)
		}
		fmt.Fprintf(env.stdout, "%s.%s migrated: %s\n", o.schema, o.table, strings.Join(names, ", "))
		return nil
	},
}
