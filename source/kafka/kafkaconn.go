package kafka

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/fetch"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl"
)

// Every path that reads a partition's log (the partition fetcher, the gap
// re-read, the comparison of a log with a stored mark) reads it through a
// [logConn]: a connection to the partition's leader that sends kafka-go's
// protocol requests and reads fetch responses itself ([logFetch]).
// kafka-go's Conn reads a fetch response for you, but drops what a
// read-committed reader needs: the response's aborted transactions, and
// which batches are control batches (it hands commit and abort markers
// over as messages). Its protocol package decodes them, but drops each
// batch's last offset, which is how a reader steps past the records Kafka's
// log cleaner removed from the end of a batch.

// isolation levels on the wire.
const (
	wireReadUncommitted int8 = 0
	wireReadCommitted   int8 = 1
)

// The protocol versions a log connection speaks: fetch v4 is the first
// with isolation levels, aborted transactions and the last stable offset
// (Kafka 0.11); list offsets v2 the first with an isolation level.
// kafka-go's protocol package knows fetch up to v11 and list offsets up to
// v5, none of them flexible.
const (
	fetchMinVersion, fetchMaxVersion     int16 = 4, 11
	offsetsMinVersion, offsetsMaxVersion int16 = 2, 5
)

// logReadBuffer is the read buffer of a log connection, above TLS. A fetch
// response is read a batch at a time; kafka-go's connection read it
// through a 4 KiB buffer, about 100,000 read(2) calls for a
// 2,000,000-event rebuild, and a 256 KiB buffer under it took the
// rebuild's CPU in system calls from 0.35 s to 0.08 s.
const logReadBuffer = 256 << 10

// logConn is a connection to the leader of one partition, for reading its
// log. It is used by one goroutine at a time.
type LogConn struct {
	conn      net.Conn
	r         *bufio.Reader
	clientID  string
	topic     string
	partition int
	corr      int32
	// fetchVersion and offsetsVersion are the versions the broker and
	// this connection share.
	fetchVersion, offsetsVersion int16
	// raw and body are a fetch's buffers, kept for the next: a batch as
	// read, and its records decompressed.
	raw, body []byte
}

// leaderLookupPerBroker bounds one broker's part of a leader lookup.
const leaderLookupPerBroker = 5 * time.Second

// dialLog connects to the leader of partition, looking it up through each
// broker in turn, with d's TLS, SASL, client id and dial function.
func DialLog(ctx context.Context, d *kafkago.Dialer, brokers []string, topic string, partition int) (*LogConn, error) {
	var errs []error
	for _, b := range brokers {
		// Each broker gets a bound of its own: one that accepts and never
		// answers must not spend the whole budget before the others are
		// asked.
		bctx, cancel := context.WithTimeout(ctx, leaderLookupPerBroker)
		leader, err := d.LookupLeader(bctx, "tcp", b, topic, partition)
		cancel()
		if err == nil {
			addr := net.JoinHostPort(leader.Host, strconv.Itoa(leader.Port))
			c, err := openLog(ctx, d, addr)
			if err != nil {
				return nil, fmt.Errorf("connect to the leader of %s/%d: %w", topic, partition, err)
			}
			c.topic, c.partition = topic, partition
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("dial the leader of %s/%d: %w", topic, partition, errors.Join(errs...))
}

// openLog connects to addr as d would: its dial function, then TLS, then
// SASL; then it agrees the protocol versions with the broker.
func openLog(ctx context.Context, d *kafkago.Dialer, addr string) (*LogConn, error) {
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	dial := d.DialFunc
	if dial == nil {
		dial = (&net.Dialer{LocalAddr: d.LocalAddr, DualStack: d.DualStack, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("failed to dial: %w", err)
	}
	// Setting up must end with ctx, whatever the broker does.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if d.TLS != nil {
		cfg := d.TLS
		if cfg.ServerName == "" {
			// As kafka-go's dialer: the host the broker was reached at.
			host, _, _ := net.SplitHostPort(addr)
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		conn = tc
	}
	c := &LogConn{conn: conn, r: bufio.NewReaderSize(conn, logReadBuffer), clientID: d.ClientID}
	if c.clientID == "" {
		c.clientID = "projector"
	}
	if err := c.setUp(ctx, d.SASLMechanism, addr); err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return c, nil
}

// setUp authenticates and agrees the versions.
func (c *LogConn) setUp(ctx context.Context, mech sasl.Mechanism, addr string) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetDeadline(dl)
		defer c.conn.SetDeadline(time.Time{})
	}
	if mech != nil {
		if err := c.authenticate(ctx, mech, addr); err != nil {
			return err
		}
	}
	res, err := c.roundTrip(0, &apiversions.Request{})
	if err != nil {
		return fmt.Errorf("api versions: %w", err)
	}
	v := res.(*apiversions.Response)
	if v.ErrorCode != 0 {
		return fmt.Errorf("api versions: %w", kafkago.Error(v.ErrorCode))
	}
	var ok bool
	if c.fetchVersion, ok = shared(v.ApiKeys, protocol.Fetch, fetchMinVersion, fetchMaxVersion); !ok {
		return fmt.Errorf("the broker does not speak fetch v%d to v%d (Kafka 0.11 or later does)", fetchMinVersion, fetchMaxVersion)
	}
	if c.offsetsVersion, ok = shared(v.ApiKeys, protocol.ListOffsets, offsetsMinVersion, offsetsMaxVersion); !ok {
		return fmt.Errorf("the broker does not speak list offsets v%d to v%d (Kafka 0.11 or later does)", offsetsMinVersion, offsetsMaxVersion)
	}
	return nil
}

// shared is the highest version of key from lo to hi that the broker
// speaks.
func shared(keys []apiversions.ApiKeyResponse, key protocol.ApiKey, lo, hi int16) (int16, bool) {
	for _, k := range keys {
		if k.ApiKey != int16(key) {
			continue
		}
		v := min(hi, k.MaxVersion)
		return v, v >= max(lo, k.MinVersion)
	}
	return 0, false
}

// authenticate runs the SASL exchange as kafka-go's dialer does: a v1
// handshake, then the mechanism's messages in SaslAuthenticate requests.
func (c *LogConn) authenticate(ctx context.Context, mech sasl.Mechanism, addr string) error {
	res, err := c.roundTrip(1, &saslhandshake.Request{Mechanism: mech.Name()})
	if err != nil {
		return fmt.Errorf("SASL handshake failed: %w", err)
	}
	if code := res.(*saslhandshake.Response).ErrorCode; code != 0 {
		return fmt.Errorf("SASL handshake failed: %w", kafkago.Error(code))
	}
	host, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	sess, state, err := mech.Start(sasl.WithMetadata(ctx, &sasl.Metadata{Host: host, Port: n}))
	if err != nil {
		return fmt.Errorf("SASL authentication process could not be started: %w", err)
	}
	for done := false; !done; {
		res, err := c.roundTrip(0, &saslauthenticate.Request{AuthBytes: state})
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			// A broker may refuse by closing the connection.
			return kafkago.SASLAuthenticationFailed
		case err != nil:
			return err
		}
		a := res.(*saslauthenticate.Response)
		if a.ErrorCode != 0 {
			return kafkago.Error(a.ErrorCode)
		}
		if done, state, err = sess.Next(ctx, a.AuthBytes); err != nil {
			return fmt.Errorf("SASL authentication process has failed: %w", err)
		}
	}
	return nil
}

// roundTrip sends msg at version and reads its answer.
func (c *LogConn) roundTrip(version int16, msg protocol.Message) (protocol.Message, error) {
	c.corr++
	if err := protocol.WriteRequest(c.conn, version, c.corr, c.clientID, msg); err != nil {
		return nil, err
	}
	id, res, err := protocol.ReadResponse(c.r, msg.ApiKey(), version)
	if err != nil {
		return nil, err
	}
	if id != c.corr {
		return nil, fmt.Errorf("kafka: correlation id %d answered, %d asked", id, c.corr)
	}
	return res, nil
}

// Close closes the connection; a read in progress returns.
func (c *LogConn) Close() error { return c.conn.Close() }

// SetReadDeadline bounds the reads from now on.
func (c *LogConn) SetReadDeadline(t time.Time) error { return c.conn.SetReadDeadline(t) }

// SetDeadline bounds reads and writes.
func (c *LogConn) SetDeadline(t time.Time) error { return c.conn.SetDeadline(t) }

// offset asks the leader for an offset of the partition: ts is a time in
// milliseconds, or kafkago.FirstOffset (the log start) or kafkago.LastOffset
// (its end: the high watermark, or the last stable offset with
// committed). -1 for a time past every record.
func (c *LogConn) offset(ts int64, committed bool) (int64, error) {
	iso := wireReadUncommitted
	if committed {
		iso = wireReadCommitted
	}
	res, err := c.roundTrip(c.offsetsVersion, &listoffsets.Request{
		ReplicaID: -1, IsolationLevel: iso,
		Topics: []listoffsets.RequestTopic{{Topic: c.topic, Partitions: []listoffsets.RequestPartition{
			{Partition: int32(c.partition), CurrentLeaderEpoch: -1, Timestamp: ts},
		}}},
	})
	if err != nil {
		return 0, err
	}
	for _, t := range res.(*listoffsets.Response).Topics {
		for _, p := range t.Partitions {
			if t.Topic != c.topic || int(p.Partition) != c.partition {
				continue
			}
			if p.ErrorCode != 0 {
				return 0, kafkago.Error(p.ErrorCode)
			}
			return p.Offset, nil
		}
	}
	return 0, fmt.Errorf("kafka: list offsets of %s/%d: no answer for the partition", c.topic, c.partition)
}

// bounds returns the partition's first offset and its end: the high
// watermark, or the last stable offset with committed.
func (c *LogConn) Bounds(committed bool) (first, end int64, err error) {
	if first, err = c.offset(kafkago.FirstOffset, false); err != nil {
		return 0, 0, err
	}
	if end, err = c.offset(kafkago.LastOffset, committed); err != nil {
		return 0, 0, err
	}
	return first, end, nil
}

// offsetAt returns the first offset whose record was appended at or after
// t; -1 when there is none.
func (c *LogConn) OffsetAt(t time.Time) (int64, error) {
	return c.offset(t.UnixMilli(), false)
}

// fetch asks for the partition's records from offset on, up to maxBytes,
// the broker holding the request up to maxWait while there is nothing to
// return, and reads the answer's header: the records follow through the
// returned [logFetch], which must be closed.
func (c *LogConn) Fetch(offset int64, maxBytes int, maxWait time.Duration, committed bool) (*LogFetch, error) {
	iso := wireReadUncommitted
	if committed {
		iso = wireReadCommitted
	}
	c.corr++
	req := &fetch.Request{
		ReplicaID: -1, MaxWaitTime: int32(maxWait.Milliseconds()), MinBytes: 1, MaxBytes: int32(maxBytes),
		IsolationLevel: iso, SessionID: 0, SessionEpoch: -1,
		Topics: []fetch.RequestTopic{{Topic: c.topic, Partitions: []fetch.RequestPartition{{
			Partition: int32(c.partition), CurrentLeaderEpoch: -1, FetchOffset: offset, LogStartOffset: -1, PartitionMaxBytes: int32(maxBytes),
		}}}},
	}
	if err := protocol.WriteRequest(c.conn, c.fetchVersion, c.corr, c.clientID, req); err != nil {
		return nil, err
	}
	f := &LogFetch{c: c, from: offset, next: offset, first: -1, committed: committed}
	if err := f.readHeader(); err != nil {
		return nil, err
	}
	return f, nil
}
