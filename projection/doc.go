// Package projection is the engine: it runs the [Lane]s a source hands it,
// all through one loop ([worker.run]), decodes and routes each record,
// folds a batch into version-conditional writes, commits them through
// [store.Store.Apply], and only then acknowledges the batch to its source.
// [Replay] runs quarantined records through the same version rules, outside
// any partition.
//
// The engine names no source. A [source.Source] (source/kafka's Group: one
// fenced lane per partition of each consumer-group generation; source/sqs's
// Queue: one shared lane per instance) is handed in as [Config.From], or
// built by name from the configuration through [source.Build] from those a
// program links in. The source tells the engine ([source.Host], host.go)
// what it consumes as (recorded in the store), its outages, its logs' ends
// and a queue's counts; its readiness checks join the engine's.
//
// A worker's records flow through one file per stage: worker.go (the loop
// and its dependencies), claim.go (claim a fenced lane, restore its held
// deltas), logcheck.go (compare a log with its stored position), fetch.go,
// plan.go (records and gap resolutions into one transaction's writes),
// commit.go (apply, settle the cache, the detector and the counters,
// acknowledge), isolate.go (a batch PostgreSQL refuses for its data) and
// adopt.go (a shared lane's held deltas other instances stored).
//
// It must never hand a
// transaction's marker over as a record, nor, reading committed, a record
// of an aborted transaction or one past the last stable offset; never move
// a partition's position past work that is not durably done, never write a
// Kafka partition without the fencing epoch it claimed (a queue's batches
// are unfenced: the conditional writes alone arbitrate), never acknowledge
// a batch before its transaction committed, and never commit a Kafka group
// offset ahead of the position stored in PostgreSQL: the stored position is
// the truth, the group offset only feeds lag tooling.
//
// How the engine is watched and reached lives in package observe, which
// reads it through interfaces it implements: [Projector.Liveness] and
// [Projector.Readiness] say, check by check, whether its loops are alive
// and whether it does its work (the source's checks: topic and group
// generation, or the queue; a recent PostgreSQL answer; lag);
// [Projector.Metrics] is a Prometheus registry of its own per Projector,
// read from the same counters as [Projector.Status], whose every family
// [MetricFamilies] lists for the generated reference; [Projector.Handler]
// serves them with /status, the status page and a job's [Explanation] as
// JSON (the explainer reads the store, so it stays here: http.go);
// outages are logged when they start, at most every 30 s while they last,
// and when they end; and a partition with lag that does not move ends
// [Projector.Run] with [ErrStalled]. The status types ([Status],
// [Counters], [PartitionStatus], [HeldJob], [HeldQuery], [HeldPage]) are
// observe's, named here too. It never logs or returns a SASL password.
package projection
