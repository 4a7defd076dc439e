package observe

import (
	"log/slog"
	"time"

	"github.com/projector/projector/source/sqs/sqscfg"
)

// Counters are cumulative record outcomes since the process started.
type Counters struct {
	Consumed int64 `json:"consumed"`
	Applied  int64 `json:"applied"`
	// Deleted counts deletes that removed a job (or marked one never
	// seen as deleted).
	Deleted int64 `json:"deleted"`
	// Covered counts held deltas dropped because a snapshot or a delete
	// at or above their version replaced the job's whole state.
	Covered     int64 `json:"covered"`
	Stale       int64 `json:"stale"`
	Duplicates  int64 `json:"duplicates"`
	Conflicts   int64 `json:"conflicts"`
	Held        int64 `json:"held"`
	Quarantined int64 `json:"quarantined"`
	Batches     int64 `json:"batches"`
	Fenced      int64 `json:"fenced"`
	// Gaps closed, by the step that closed them.
	ClosedByWait     int64 `json:"gaps_closed_by_wait"`
	ClosedByReread   int64 `json:"gaps_closed_by_reread"`
	ClosedBySnapshot int64 `json:"gaps_closed_by_snapshot"`
	// HeldJobs is how many jobs are held right now.
	HeldJobs int64 `json:"held_jobs"`
	// Lost counts records deleted from the log (retention, compaction)
	// before they could be read.
	Lost int64 `json:"lost_before_read"`
	// NewLogs counts partitions found reading a new log (a topic deleted
	// and recreated) and read again from its start.
	NewLogs int64 `json:"new_logs"`
	// GapsOpened counts jobs that started waiting behind a gap.
	GapsOpened int64 `json:"gaps_opened"`
	// DatabaseErrors counts failed PostgreSQL operations (batches, claims,
	// reloads, pings), retried.
	DatabaseErrors int64 `json:"database_errors"`
	// Authority requests (snapshot fetches) by result.
	AuthorityOK       int64 `json:"authority_ok"`
	AuthorityNotFound int64 `json:"authority_not_found"`
	AuthorityError    int64 `json:"authority_error"`
	// AuthorityTimeouts counts fetches that ended with a request cut by
	// its timeout (counted in AuthorityError too); each gives its job's
	// next request twice the time.
	AuthorityTimeouts int64 `json:"authority_timeouts"`
	// TombstonesPruned counts tombstones removed after the tombstone
	// retention.
	TombstonesPruned int64 `json:"tombstones_pruned"`
	// Stalls counts partitions found with lag and no progress for the
	// stall timeout (the instance stops at the first).
	Stalls int64 `json:"stalls"`
}

// LogValue lets a log line show the counters as attributes.
func (c Counters) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int64("consumed", c.Consumed), slog.Int64("applied", c.Applied), slog.Int64("deleted", c.Deleted),
		slog.Int64("covered", c.Covered), slog.Int64("stale", c.Stale),
		slog.Int64("duplicates", c.Duplicates), slog.Int64("conflicts", c.Conflicts), slog.Int64("held", c.Held),
		slog.Int64("quarantined", c.Quarantined), slog.Int64("batches", c.Batches), slog.Int64("fenced", c.Fenced),
		slog.Int64("gaps_closed_by_wait", c.ClosedByWait), slog.Int64("gaps_closed_by_reread", c.ClosedByReread),
		slog.Int64("gaps_closed_by_snapshot", c.ClosedBySnapshot), slog.Int64("lost_before_read", c.Lost),
		slog.Int64("gaps_opened", c.GapsOpened), slog.Int64("database_errors", c.DatabaseErrors),
		slog.Int64("tombstones_pruned", c.TombstonesPruned), slog.Int64("new_logs", c.NewLogs),
	)
}

// PartitionStatus is one partition this instance works.
type PartitionStatus struct {
	Partition int `json:"partition"`
	// Position is the next offset to read, as committed in PostgreSQL
	// (-1: none yet); named next_offset everywhere outside Go.
	Position int64 `json:"next_offset"`
	// HighWatermark is the partition's end as last seen from the broker,
	// read at least every 5 s; LastStable its last stable offset, below
	// which every transaction has committed or aborted (the first offset
	// of the oldest one still open, else the high watermark).
	HighWatermark int64 `json:"high_watermark"`
	LastStable    int64 `json:"last_stable_offset"`
	// Lag is the records between Position and where this instance can
	// read to: the last stable offset reading committed (a transaction
	// still open is waited on, not lag), the high watermark reading
	// uncommitted ([Status] LagMeasuredTo).
	Lag int64 `json:"lag"`
	// LagUnknown says the lag could not be read (an SQS queue whose
	// counts are refused or failing): Lag and HighWatermark are 0 then,
	// and count as no lag.
	LagUnknown bool `json:"lag_unknown,omitempty"`
	// OpenTransaction, reading committed, is the transaction still open
	// the partition waits on: every record before it is projected.
	OpenTransaction *OpenTransaction `json:"open_transaction,omitempty"`
	Epoch           int64            `json:"epoch"`
	UpdatedAt       time.Time        `json:"updated_at"`
	// HeldJobs is how many jobs of the partition wait for missing
	// versions.
	HeldJobs int `json:"held_jobs"`
	// Held lists those of them that the status's page shows (see
	// [HeldPage]), oldest first.
	Held []HeldJob `json:"held"`

	// View is the partition's MaxHeldLimit oldest held jobs, oldest
	// first (by HeldJob.Since, then job id), as its worker last built them
	// from ViewOf held jobs ([SortHeld]); never written once published,
	// and shared by every status handed out since: read it, never change
	// it. Held is paged from it ([PageHeld]).
	View   []HeldJob `json:"-"`
	ViewOf int       `json:"-"`
}

// HeldJob is one job the gap detector holds.
type HeldJob struct {
	JobID string `json:"job_id"`
	// Version is the row's version; Missing the versions it waits for.
	Version    int64   `json:"version"`
	Missing    []int64 `json:"missing"`
	HeldDeltas int     `json:"held_deltas"`
	// Since is when the job began to wait, or to wait again after it
	// moved forward but stayed held.
	Since       time.Time `json:"since"`
	Attempts    int       `json:"attempts"`
	NextAttempt time.Time `json:"next_attempt"`
	LastStep    string    `json:"last_step"`
	LastError   string    `json:"last_error,omitempty"`
	// ReadsTo, while the job's first attempt waits for the partition to
	// be read as far as its log ended when the gap opened (the missing
	// version may simply not be read yet), is that offset.
	ReadsTo *int64 `json:"reads_to,omitempty"`
}

// Status is what /status serves.
type Status struct {
	Topic      string            `json:"topic"`
	Group      string            `json:"group"`
	Owner      string            `json:"owner"`
	Generation int32             `json:"generation"`
	Ready      bool              `json:"ready"`
	Readiness  Health            `json:"readiness"`
	Partitions []PartitionStatus `json:"partitions"`
	Counters   Counters          `json:"counters"`
	// Source is kafka or sqs; SQS is the queue's view with Source sqs
	// ([sqscfg.Status]).
	Source string         `json:"source"`
	SQS    *sqscfg.Status `json:"sqs,omitempty"`
	// HeldPage says which held jobs the partitions' Held lists show.
	HeldPage HeldPage `json:"held_page"`
	// Isolation is how Kafka transactions are read (Config.Isolation);
	// LagMeasuredTo is what the partitions' lag is measured to:
	// last_stable_offset reading committed, high_watermark reading
	// uncommitted. Empty for SQS.
	Isolation     string `json:"isolation,omitempty"`
	LagMeasuredTo string `json:"lag_measured_to,omitempty"`
}

// What lag is measured to ([Status] LagMeasuredTo).
const (
	LagToStable        = "last_stable_offset"
	LagToHighWatermark = "high_watermark"
)

// OpenTransaction is a transaction still open that a partition waits on,
// read committed: every record before it is projected.
type OpenTransaction struct {
	// Offset is where it starts: the partition's last stable offset.
	Offset int64 `json:"offset"`
	// Waiting is how many offsets past Offset wait for it to end (its
	// records, other producers' records and markers): the high watermark
	// minus Offset.
	Waiting int64 `json:"waiting"`
	// Since is when the partition was first seen waiting on it.
	Since time.Time `json:"since"`
}
