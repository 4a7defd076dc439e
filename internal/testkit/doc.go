// Package testkit holds nothing itself: its subpackages are what the tests
// use and the binary never links (cmd/projector's deps test checks it):
// PostgreSQL databases per test and a proxy that cuts them (pgtest), an
// in-process Kafka broker per test (kafkatest), the SQS emulator per test
// (sqstest), and the fault suite's invariants (faulttest).
package testkit
