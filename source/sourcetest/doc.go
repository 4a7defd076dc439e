// Package sourcetest is the conformance suite every source of the
// projector passes: [Run] drives a source's [source.Lane] against its real
// service (Kafka's kfake broker, the SQS emulator) and checks what the
// engine's one lane loop relies on, whatever is behind the lane: order
// within a key or group, every record delivered in bounded batches,
// acknowledgement only after commit and redelivery of what was not
// acknowledged, release on close, the log's ends where there is a log, an
// outage reported and recovered, and capabilities as the source declares
// them. A [Features] struct says what a source cannot do (watermill's
// pubsub/tests, river's driver test suite).
//
// A new source is a package and a passing suite: its test gives [Run] a
// [Harness] that makes fresh lanes on the service and produces records
// into them.
//
// Only tests import it: it links the testing package. It must never mock
// the service a source talks to.
package sourcetest
