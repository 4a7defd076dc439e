// Package gapfill owns the version rules for deltas (docs/contract.md, section 2):
// which delta is next in line, which is a duplicate, which is ahead of a
// gap and must be held, and how a held gap is closed: wait for the missing
// versions, re-read the store and the log, or take a trusted snapshot (or
// delete). A delete is a whole-state event: it covers the held deltas
// below it, and a delta next in line after it is rejected.
//
// [Advance] is the pure core: one job's row, its held deltas and a run of
// incoming events in, the new row and every event's outcome out. [Detector]
// is the pure clock of the policy chain: which step is due for which held
// job, given the time it is passed. [Resolver] carries the steps out
// through the small interfaces it declares. Nothing here may apply a delta
// out of order, apply one twice, or drop a held delta that no snapshot
// covers: a gap that cannot be closed stays held and visible.
package gapfill
