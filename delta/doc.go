// Package delta owns the incremental half of the wire format: the ops of a
// delta event (set, remove, increment on RFC 6901 JSON Pointer paths), their
// validation, and applying them to a job's JSON state.
//
// It is pure: it takes values and returns values, with no I/O, no clock and
// no logging, so it can be fuzzed and tested without services. It must never
// round a number through float64 when both sides are integers: increments are
// exact for integers up to 2^53 and beyond, because a drifting counter would
// corrupt a read model forever.
package delta
