// Package sqsemu runs the SQS emulator that tests and `projector demo
// --source sqs` talk to: fauxqs, a Node.js program pinned in the
// repository's package.json and installed with `npm ci` at the repository
// root. [Start] runs it as a subprocess on a free loopback port and
// returns once it answers; [Emulator.Close] stops it. The subprocess also
// ends on its own when this process dies (it watches its standard input).
//
// The emulator speaks the JSON protocol of the current AWS SDKs. Where its
// FIFO semantics differ from SQS is written in docs/guide/sqs.md ("The
// emulator the tests use"): the tests rely only on what both do. [Locate]
// looks for node_modules in FAUXQS_DIR, else in the working directory and
// its parents, so the demo finds it when run from the repository.
//
// It must never import the testing package: the product binary links it
// for the demo. The testing.TB wrappers live in internal/testkit/sqstest.
package sqsemu
