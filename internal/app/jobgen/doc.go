// Package jobgen generates realistic, deterministic job event streams for
// tests, the demo and the benchmark: each job goes pending → running with
// progress deltas → completed or failed, with occasional full snapshots.
// It keeps the reference model (the true final state of every job) and
// serves it as a trusted snapshot authority over HTTP, and it can inject
// every fault the projector must survive: late events, duplicate
// deliveries, deltas that never arrive, deltas produced into the wrong
// partition, and bad records.
//
// Every choice of a job is drawn from the seed and the job's number, so a
// stream is planned first (its reference, counts and faults, 8 bytes a job
// kept) and its records are made as a Reader reads them: a stream of
// millions of events is never whole in memory. Generate reads them all,
// for the small streams of tests and the demo.
package jobgen
