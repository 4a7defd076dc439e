// Package observe is how the engine (package projection) is watched and
// reached, kept apart from the engine's files so that what an operator
// reads is written in one place and reads the engine only through what it
// is given.
//
// [Liveness] and [HealthOf] make the answers of /healthz and /readyz from
// checks: the loops registered in [Loops], each beating ([Beat]) while
// alive; PostgreSQL's last answer ([Database]); and the progress check of
// the [Watchdog], which stops the engine's Run with [ErrStalled] when a
// partition with lag makes no progress for the stall timeout. [Outage]
// turns the failures of many goroutines talking to one service into few
// log lines, and [Sampler] rate-limits a kind of log line.
//
// [Status] is what /status serves, its held jobs paged by [PageHeld] from
// each partition's view ([PartitionStatus] View), so that a status costs
// the same however many jobs are held. [Metrics] is one engine's
// Prometheus registry; [NewCollector] reads the engine's status at scrape
// time ([Scraped]), and [EveryFamily] gives one sample of every family for
// the generated metric reference. [Handler] serves /healthz, /readyz,
// /status, /metrics, the status page (/status as HTML, record text through
// [Printable]) and the /explain handler it is handed, over the [Engine]
// interface.
//
// The engine implements [Engine], [Scraped] and [Watched]; this package
// never imports it.
package observe
