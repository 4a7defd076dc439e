// Package wait answers clients that must read their own writes: a
// [Waiter] tells when a job's row has reached a version (or the job was
// deleted at or above it), or when a partition's stored position has
// passed an offset, or that a deadline came first.
//
// It owns one LISTEN connection per process on the projection's channel
// (every committed batch is announced there by [store.Store.Apply],
// whichever instance committed it), wakes every waiter on each
// notification and checks them all in one query per wake-up. It also owns
// the HTTP long-poll ([Handler]) that exposes it.
//
// It must never hold a pooled connection while a waiter sleeps, never
// start a goroutine per waiter, and never keep more waiters than its
// bound ([ErrTooManyWaiters]). It reads the read model and writes nothing.
package wait
