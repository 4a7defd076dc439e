// Package broker owns the in-process Kafka broker that tests, `projector
// demo` and `projector bench` run against: a [Cluster] wraps kfake, which
// speaks the Kafka protocol on loopback TCP, so the real kafka-go client is
// exercised end to end with no external broker.
//
// It owns starting and stopping the broker ([Start], [Cluster.Close]),
// creating and growing topics ([Cluster.CreateTopic],
// [Cluster.AddPartitions]), producing at an explicit partition with the
// offsets the broker assigned ([Cluster.Produce]) or by key with Java's
// partitioner ([Cluster.ProduceKeyed]), reading high watermarks
// ([Cluster.HighWatermarks]), and consumer-group timings short enough for
// rebalances to take milliseconds ([Cluster.GroupConfig]).
//
// It must never import the testing package: the product binary links it
// for `projector demo` and `projector bench`, and a binary that links
// testing registers test flags and ships test support. The testing.TB
// wrappers live in internal/testkit/kafkatest.
//
// Automatic topic creation is off: kafka-go asks for it on every metadata
// request it sends through a Conn (the consumer group's assignment and
// partition watcher, Reader), so with it on a typo or a group started before
// its topic would silently create a topic with the default partition count.
// Create topics explicitly.
//
// It must never be imported by the product packages (`projection`, `store`,
// ...): the engine may not know which broker it talks to. It never sleeps to
// synchronise; it polls a condition until the context ends.
package broker
