// Package projection is the engine: it joins the Kafka consumer group, runs
// one worker per assigned partition, decodes and routes each record, folds a
// batch into version-conditional writes and commits them, with the
// partition's position, through [store.Store.Apply]. [Replay] runs
// quarantined records through the same version rules, outside any partition.
//
// It is the only package that imports kafka-go. It must never move a
// partition's position past work that is not durably done, never write
// without the fencing epoch it claimed, and never commit a Kafka group
// offset ahead of the position stored in PostgreSQL: the stored position is
// the truth, the group offset only feeds lag tooling.
package projection
