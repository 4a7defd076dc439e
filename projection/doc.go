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
//
// It also owns how the engine is watched and reached: every connection to
// the brokers goes through one dialer and one transport built from
// [Config.TLS] and [Config.SASL] ([Kafka]); [Projector.Liveness] and
// [Projector.Readiness] say, check by check, whether its loops are alive and
// whether it does its work (topic, group generation, a recent PostgreSQL
// answer, lag); [Projector.Metrics] is a Prometheus registry of its own per
// Projector, read from the same counters as [Projector.Status]; outages are
// logged when they start, at most every 30 s while they last, and when they
// end. It never logs or returns a SASL password.
package projection
