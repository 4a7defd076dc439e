// Package app holds nothing itself: its subpackages are code the projector
// binary ships for its own commands, not the engine: the in-process broker
// (broker) and the SQS emulator's launcher (sqsemu) that `projector demo`
// and `projector bench` run, the event generator (jobgen), the demo (demo)
// and the benchmark (bench). Beside it, internal/testkit holds what only
// tests use, and internal/buildhook the hooks a test build compiles in.
package app
