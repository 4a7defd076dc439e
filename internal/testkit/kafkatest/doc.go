// Package kafkatest is the testing.TB side of the in-process broker of
// internal/app/broker: [New] starts a broker for a test and closes it at the
// test's end, [Topic] creates a topic named after the test. The rest of
// the broker's API is re-exported here under the same names, so a test
// imports one package.
//
// Only tests import it: it links the testing package, which the product
// binary must not (`projector demo` and `projector bench` use
// internal/app/broker directly).
package kafkatest
