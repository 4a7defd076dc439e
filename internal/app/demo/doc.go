// Package demo runs the whole story on one machine: an in-process Kafka
// broker, a generated job event stream with every fault kind, a trusted
// snapshot authority, the same engine as `projector run`, and a check of
// every projected row against the reference model.
//
// It is tool support, not product: it may use the in-process broker and
// the generator directly, and it must never leave anything behind: its
// schema, its broker and any throwaway cluster go away when it ends.
package demo
