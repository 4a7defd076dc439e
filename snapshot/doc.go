// Package snapshot owns whole-state events: folding a job's snapshots to the
// one that wins (the highest version, the first of equals), telling stale
// and conflicting ones apart, and fetching a trusted snapshot from the
// authority (docs/contract.md, section 3).
//
// Folding is pure. The client is the only I/O here and it never applies
// anything itself: what it fetches goes through the same version-monotonic
// write as every snapshot from the log.
package snapshot
