// Package event owns the wire format of one job event (docs/contract.md, section 1):
// decoding a Kafka record's key and value into an [Event] and refusing, with a
// typed [*FieldError] that names the field, anything that breaks the format.
//
// It is pure and never guesses: a record it cannot order (no version, a
// tombstone, a value over [MaxValueBytes]) is an error for the caller to
// quarantine, never an event with a made-up version.
package event
