// Package store owns everything PostgreSQL: the embedded migrations, the
// read-model table, the version-conditional batch writes, the partition
// positions and their fencing epochs, held deltas, the quarantine, the
// tombstones of deleted jobs, and the gap log.
//
// It is the only package that imports pgx, and it translates pgx errors into
// its own ([ErrFenced]) before they leave. It must never write a job row
// without the version condition in the same statement: the check and the
// write are one atomic statement, never a read followed by a blind write.
// Where the condition spans the read model and the tombstones (a snapshot
// that may create a row, a delete), the batch's job stripe locks order the
// writers, so a deleted job never comes back below its delete's version.
// Every batch commits in one transaction together with the partition
// position it covers, and that transaction starts with the fence. Each
// batch also announces itself on the projection's [Store.Channel], sent
// with the fence, so listeners hear of it once it commits. The
// writes made outside a partition ([Store.Unquarantine] for a replay,
// [Store.Heal] for a repair) touch no position and no epoch, and rely on
// the same version conditions alone.
package store
