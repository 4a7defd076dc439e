package projection

import "time"

// A partition written by transactional producers, read committed, is read
// up to its last stable offset: the first offset of the oldest
// transaction still open. While one is open, the records after it (of
// that transaction, and of every other producer) wait until it commits or
// is aborted. A producer that died leaves its transaction open until its
// transaction timeout aborts it (the producer's transaction.timeout.ms, up
// to the broker's transaction.max.timeout.ms, 15 minutes by default). The
// lag is measured to the last stable offset,
// so such a wait is no lag, no stall and no reason to be unready; the
// status shows it ([OpenTransaction]) and the log says it when it lasts.

// openTxnLogAfter is how long a partition waits on one open transaction
// before the log says so, and how often it says so again while the wait
// lasts (openTxnLogEvery). Transactions commit every few hundred
// milliseconds (Kafka Streams) to every few minutes (Flink checkpoints):
// shorter waits are the stream's rhythm, not news.
const (
	openTxnLogAfter = 10 * time.Second
	openTxnLogEvery = 5 * time.Minute
)

// openTxn is the wait a worker is in, if any.
type openTxn struct {
	offset int64
	since  time.Time
	// logged is when the wait was last logged; zero before.
	logged time.Time
}

// waitsOnTransaction returns the open transaction the partition waits on,
// logging a wait that lasts and its end; nil when it waits on none.
func (w *worker) waitsOnTransaction() *OpenTransaction {
	waiting := w.cfg.ReadCommitted && w.stable < w.hwm && w.stored >= w.stable
	if w.open.since.IsZero() || !waiting || w.open.offset != w.stable {
		if !w.open.logged.IsZero() {
			w.log.Info("the open transaction the partition waited on ended; reading on",
				"offset", w.open.offset, "waited", time.Since(w.open.since).Round(time.Millisecond).String())
		}
		w.open = openTxn{}
		if !waiting {
			return nil
		}
		w.open = openTxn{offset: w.stable, since: time.Now()}
	}
	after := openTxnLogAfter
	if w.cfg.OpenTxnLogAfter > 0 {
		after = w.cfg.OpenTxnLogAfter
	}
	now := time.Now()
	if now.Sub(w.open.since) >= after && (w.open.logged.IsZero() || now.Sub(w.open.logged) >= openTxnLogEvery) {
		w.open.logged = now
		w.log.Info("the partition waits on a transaction still open: every record before it is projected, and what follows is read once it commits or is aborted (a producer that died leaves it open until its transaction timeout aborts it: the producer's transaction.timeout.ms, at most the broker's transaction.max.timeout.ms, 15 minutes by default)",
			"offset", w.stable, "waiting_offsets", w.hwm-w.stable, "since", w.open.since.Format(time.RFC3339))
	}
	return &OpenTransaction{Offset: w.stable, Waiting: w.hwm - w.stable, Since: w.open.since}
}
