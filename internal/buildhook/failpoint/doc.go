// Package failpoint marks the points of the engine where the fault suite
// kills the process: before a batch transaction commits, between the
// PostgreSQL commit and the Kafka group commit, during a gap attempt, and
// right after a partition is claimed.
//
// In a normal build [Hit] does nothing and compiles away: the product
// binary carries no failpoint. Built with `-tags failpoints`, [Hit] reads
// PROJECTOR_FAILPOINTS once, a comma-separated list of name=N, and kills
// the process with SIGKILL at the Nth hit of a named point, after writing
// "failpoint NAME: SIGKILL" to standard error, so a test can tell the
// failpoint from any other death. name=N:stop stops the process with
// SIGSTOP instead (a frozen process, a zombie once its session times out),
// after writing "failpoint NAME: SIGSTOP"; it goes on from there when the
// test sends SIGCONT.
//
// It must never do anything but count and kill: no sleeps, no errors
// returned, no state a test could depend on other than the process dying.
// The one exception is a switch, not a point: with no-fence=1 in
// PROJECTOR_FAILPOINTS, [Unfenced] reports true and the engine commits
// Kafka batches without the partition fence (and without storing
// positions), as a share group (KIP-932) hands one partition's records to
// several consumers at once. It exists to prove that the conditional
// writes alone keep the read model exact; a normal build cannot turn it on.
package failpoint

// Env names the variable a failpoints build reads; a normal build never
// reads it.
const Env = "PROJECTOR_FAILPOINTS"

// The points, by name.
const (
	BeforeCommit = "batch-before-commit" // the batch's writes are sent, its transaction not committed
	AfterCommit  = "batch-after-commit"  // committed in PostgreSQL, not yet offered to the group commit
	GapAttempt   = "gap-attempt"         // a re-read or an authority fetch is running
	Claimed      = "claimed"             // the epoch is bumped, nothing read yet
	Planned      = "batch-planned"       // a batch is read and planned, its transaction not begun
)

// NoFence is the switch that turns the partition fence off ([Unfenced]).
const NoFence = "no-fence"
