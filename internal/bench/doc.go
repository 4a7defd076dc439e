// Package bench measures the projector's throughput side by side with the
// ways teams write read models without it, on the same machine, stream and
// server, in one run, and reports each as a ratio of raw COPY speed.
//
// It must never time a line that does less than the projector's contract
// asks without saying so in the line's name or note: the baselines are
// there to be compared, not to flatter.
package bench
