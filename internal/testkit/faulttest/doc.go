// Package faulttest checks a projection's whole history after a fault, the
// way Jepsen-style suites do: the fault is injected, the stream flows, and
// then invariants are checked over everything that happened, not only over
// the final rows.
//
// It owns:
//   - the audit: a trigger, installed by a test on its own schema, that
//     records every change of the read model and of the tombstones in a
//     table ([Audit]);
//   - the reference model of a produced stream, replayed from the records
//     themselves ([Reference]);
//   - the invariant checks ([History.Check]): every job at its highest
//     version with exactly the reference state, or held with a visible
//     reason, or deleted; versions only increase; every version written
//     has exactly the reference state of that version, so a delta applied
//     twice or skipped shows; the Kafka group's committed offset never
//     passes the position stored in PostgreSQL and neither goes backwards;
//     the lag returns to zero once the fault heals;
//   - network faults: a TCP [Proxy] and a [Gate]d listener for the
//     in-process broker, either of which can be cut (connections dropped,
//     new ones refused) or stalled (bytes held) and restored.
//
// It is test support: it must never be imported by the product packages
// (`projection`, `store`, `cmd/projector` outside its tests), and it never
// writes to a projection's own tables.
package faulttest
