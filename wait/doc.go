// Package wait answers clients that must read their own writes: a
// [Waiter] tells when a job's row has reached a version (or the job was
// deleted at or above it), or when a partition's stored position has
// passed an offset, or that a deadline came first.
//
// It owns one LISTEN connection per process on the projection's channel
// and the process's lease (see [store.Store.HoldWaitLease]): while a
// lease is live, every committed batch is announced there by
// [store.Store.Apply], whichever instance committed it. It wakes the
// waiters a notification may concern and checks them in one query per
// wake-up, reads every waiter at a bounded interval whatever was
// announced, and proves the listening connection alive on a heartbeat.
// It also owns the HTTP long-poll ([Handler]) that exposes it.
//
// It reads through its Store's pool: give it a pool of its own (as
// `projector run --api-addr` does), so that its reads never take a
// connection the projector's batches need.
//
// It must never hold a pooled connection while a waiter sleeps, never
// start a goroutine per waiter, and never keep more waiters than its
// bound ([ErrTooManyWaiters]). It reads the read model and writes only its
// own lease row.
package wait
