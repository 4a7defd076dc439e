package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/projector/projector/internal/app/broker"
	"github.com/projector/projector/internal/app/jobgen"
)

// BrokerChildEnv, set in the environment of `projector bench`, makes the
// process serve the benchmark's broker instead (see [ServeBroker]).
const BrokerChildEnv = "PROJECTOR_BENCH_BROKER_CHILD"

// ServeBroker runs the in-process Kafka-protocol broker for a parent bench
// process: it writes "addrs <host:port,...>" on out and serves until in
// reaches EOF (the parent closed it or died) or ctx ends. The broker holds
// every record produced; running it in its own process keeps its memory
// out of the projector's heap and RSS figures.
func ServeBroker(ctx context.Context, in io.Reader, out io.Writer) error {
	c, err := broker.Start()
	if err != nil {
		return fmt.Errorf("bench: broker: %w", err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(out, "addrs %s\n", strings.Join(c.Addrs(), ",")); err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, in); close(eof) }()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	return nil
}

// brokerProc is the benchmark's broker: a child process, or (when no
// executable to start is configured, as in the package's tests) one in
// this process.
type brokerProc struct {
	addrs []string
	// inProcess says the broker's memory is inside this process's figures.
	inProcess bool
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	local     *broker.Cluster
	client    *kafka.Client
	transport *kafka.Transport
}

func startBroker(ctx context.Context, self string) (*brokerProc, error) {
	b := &brokerProc{}
	if self == "" {
		c, err := broker.Start()
		if err != nil {
			return nil, fmt.Errorf("bench: broker: %w", err)
		}
		b.local, b.addrs, b.inProcess = c, c.Addrs(), true
	} else {
		cmd := exec.Command(self, "bench")
		cmd.Env = append(os.Environ(), BrokerChildEnv+"=1")
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("bench: start broker process: %w", err)
		}
		b.cmd, b.stdin = cmd, stdin
		line, err := bufio.NewReader(stdout).ReadString('\n')
		addrs, ok := strings.CutPrefix(strings.TrimSpace(line), "addrs ")
		if err != nil || !ok {
			b.close()
			return nil, fmt.Errorf("bench: broker process did not start (read %q): %v", line, err)
		}
		b.addrs = strings.Split(addrs, ",")
	}
	b.transport = &kafka.Transport{}
	b.client = &kafka.Client{Addr: kafka.TCP(b.addrs...), Transport: b.transport, Timeout: 30 * time.Second}
	return b, nil
}

// peakRSS is the broker process's peak resident set, 0 when unknown or in
// this process.
func (b *brokerProc) peakRSS() int64 {
	if b.cmd == nil || b.cmd.Process == nil {
		return 0
	}
	return procStatusBytes("/proc/"+strconv.Itoa(b.cmd.Process.Pid)+"/status", "VmHWM:")
}

func (b *brokerProc) close() {
	if b.transport != nil {
		b.transport.CloseIdleConnections()
	}
	if b.local != nil {
		b.local.Close()
	}
	if b.cmd != nil {
		_ = b.stdin.Close()
		done := make(chan struct{})
		go func() { _ = b.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-done
		}
	}
}

func (b *brokerProc) createTopic(ctx context.Context, topic string, partitions int) error {
	resp, err := b.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		return fmt.Errorf("bench: create topic %s: %w", topic, err)
	}
	if err := resp.Errors[topic]; err != nil {
		return fmt.Errorf("bench: create topic %s: %w", topic, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := b.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			b.transport.CloseIdleConnections() // drop cached metadata
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: create topic %s: partitions not visible after 30s (%v)", topic, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// produce writes recs (in order within each partition, partitions at once,
// batches of up to 5000 records or 512 KiB) and returns each record's
// offset.
func (b *brokerProc) produce(ctx context.Context, topic string, recs []jobgen.Record) ([]int64, error) {
	offsets := make([]int64, len(recs))
	byPart := map[int][]int{}
	for i, r := range recs {
		byPart[r.Partition] = append(byPart[r.Partition], i)
	}
	now := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for p, idx := range byPart {
		g.Go(func() error {
			for len(idx) > 0 {
				n, size := 0, 0
				for n < len(idx) && n < 5000 {
					size += len(recs[idx[n]].Key) + len(recs[idx[n]].Value) + 64
					if n > 0 && size > 512<<10 {
						break
					}
					n++
				}
				batch := make([]kafka.Record, n)
				for i, ri := range idx[:n] {
					batch[i] = kafka.Record{Time: now, Key: kafka.NewBytes(recs[ri].Key), Value: kafka.NewBytes(recs[ri].Value)}
				}
				resp, err := b.client.Produce(gctx, &kafka.ProduceRequest{
					Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(batch...),
				})
				if err == nil && resp.Error != nil {
					err = resp.Error
				}
				if err != nil {
					return fmt.Errorf("bench: produce %s p%d: %w", topic, p, err)
				}
				for i, ri := range idx[:n] {
					offsets[ri] = resp.BaseOffset + int64(i)
				}
				idx = idx[n:]
			}
			return nil
		})
	}
	return offsets, g.Wait()
}

// highWatermarks maps each partition of topic to its end offset.
func (b *brokerProc) highWatermarks(ctx context.Context, topic string, partitions int) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, partitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	resp, err := b.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("bench: high watermarks %s: %w", topic, err)
	}
	out := make(map[int]int64, partitions)
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("bench: high watermarks %s p%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.LastOffset
	}
	if len(out) != partitions {
		return nil, errors.New("bench: high watermarks: partitions missing from the answer")
	}
	return out, nil
}
