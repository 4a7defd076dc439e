// Package bench measures the projector's throughput side by side with the
// ways teams write read models without it, on the same machine, stream and
// server, in one run, and reports each as a ratio of raw COPY speed; with
// them the projector's peak memory, its rate against a grown table, a
// rebuild's time and the produce-to-visible latency at a steady rate.
//
// It must never time a line that does less than the projector's contract
// asks without saying so in the line's name or note: the baselines are
// there to be compared, not to flatter. A projector run whose read model is
// not exactly the stream's reference is a failure, however fast. The broker
// runs in a child process when it can, so that the memory figures are the
// projector's own.
package bench
