package kafka

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/projector/projector/source"
)

// logFetch is one fetch response of a [logConn], read as a consumer with
// the fetch's isolation level reads it, record by record ([logFetch.Next]):
//
//   - a control batch (a transaction's commit or abort marker) is never
//     handed over; its offset is passed;
//   - read committed, a batch of a transaction the response lists as
//     aborted is passed whole, from the transaction's first offset until
//     its producer's abort marker (the Java consumer's rule); the broker
//     sends nothing past the last stable offset;
//   - a batch's offsets run to its last offset even when the log cleaner
//     removed its last records: reading goes on past it.
//
// [logFetch.Next] says where reading goes on ([logFetch.next]), whatever
// it passed.
type LogFetch struct {
	c *LogConn
	// remain is what is left of the response; once its header is read,
	// the partition's record set.
	remain int
	err    error
	// HighWatermark and LastStable are the partition's end and its last
	// stable offset as the response gives them.
	HighWatermark, LastStable int64
	from                      int64
	committed                 bool
	// aborted are the response's aborted transactions not yet reached,
	// by first offset; abortedBy the producers whose transaction is
	// aborted at the batch being read, until their abort marker.
	aborted   []abortedTxn
	abortedBy map[int64]bool
	// next is where reading goes on: past every record handed over and
	// every offset passed. first is the offset of the first entry of the
	// log at or after from that the response holds (a record, handed over
	// or not, or a marker); -1 before one.
	next, first int64

	// The batch being read: its records (decompressed), how many are
	// left, where the next starts, its first offset and timestamp, and
	// its last offset + 1.
	recs     []byte
	left     int
	base     int64
	baseTime int64
	end      int64
	// legacy is a v0 or v1 message set being read, decoded by kafka-go.
	legacy protocol.RecordReader
}

// abortedTxn is an aborted transaction as a fetch response lists it.
type abortedTxn struct{ producer, first int64 }

// Next returns the next record to hand over; false at the response's end.
func (f *LogFetch) Next() (source.Record, bool, error) {
	for {
		if f.legacy != nil {
			rec, ok, err := f.nextLegacy()
			if ok || err != nil {
				return rec, ok, err
			}
			continue
		}
		if f.left > 0 {
			rec, ok, err := f.nextRecord()
			if ok || err != nil {
				return rec, ok, err
			}
			continue
		}
		f.next = max(f.next, f.end)
		more, err := f.nextBatch()
		if !more || err != nil {
			return source.Record{}, false, err
		}
	}
}

// Close discards what is left of the response, so that the connection
// can be asked again.
func (f *LogFetch) Close() error {
	if f.remain > 0 {
		n, err := f.c.r.Discard(f.remain)
		f.remain -= n
		return err
	}
	return nil
}

// batchHeader is the size of a v2 batch's header; legacyPrefix what every
// entry of a record set starts with, up to its magic byte.
const (
	batchHeader  = 61
	legacyPrefix = 17
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// nextBatch reads the record set's next batch, passing those that hand
// nothing over; false at the record set's end (a batch cut by the
// response's size limit ends it too).
func (f *LogFetch) nextBatch() (bool, error) {
	for {
		if f.remain < legacyPrefix {
			return false, f.skip(f.remain)
		}
		head, err := f.c.r.Peek(legacyPrefix)
		if err != nil {
			return false, err
		}
		base := int64(binary.BigEndian.Uint64(head[0:]))
		size := 12 + int(int32(binary.BigEndian.Uint32(head[8:])))
		magic := head[16]
		switch {
		case size > f.remain || size < legacyPrefix:
			// Cut by the response's size: read again from here.
			return false, f.skip(f.remain)
		case magic < 2:
			return true, f.readLegacy(size)
		case size < batchHeader:
			return false, fmt.Errorf("kafka: %s/%d: a batch of %d bytes at offset %d", f.c.topic, f.c.partition, size, base)
		}
		var h [batchHeader]byte
		if err := f.read(h[:]); err != nil {
			return false, err
		}
		attrs := protocol.Attributes(binary.BigEndian.Uint16(h[21:]))
		lastDelta := int32(binary.BigEndian.Uint32(h[23:]))
		firstTime := int64(binary.BigEndian.Uint64(h[27:]))
		producer := int64(binary.BigEndian.Uint64(h[43:]))
		count := int(int32(binary.BigEndian.Uint32(h[57:])))
		end := base + int64(lastDelta) + 1
		if end <= f.from {
			// Wholly before the offset asked for (an answer starts at
			// the batch that holds it).
			if err := f.skip(size - batchHeader); err != nil {
				return false, err
			}
			continue
		}
		body := size - batchHeader
		if cap(f.c.raw) < body {
			f.c.raw = make([]byte, body)
		}
		raw := f.c.raw[:body]
		if err := f.read(raw); err != nil {
			return false, err
		}
		if crc32.Update(crc32.Checksum(h[21:], castagnoli), castagnoli, raw) != binary.BigEndian.Uint32(h[17:]) {
			return false, fmt.Errorf("kafka: %s/%d: the batch at offset %d fails its CRC check", f.c.topic, f.c.partition, base)
		}
		if f.passAborted(attrs, producer, end, raw) || attrs.Control() {
			if f.first < 0 {
				f.first = max(base, f.from)
			}
			f.next = max(f.next, end)
			continue
		}
		if f.recs, err = f.decompress(attrs, raw); err != nil {
			return false, fmt.Errorf("kafka: %s/%d: the batch at offset %d: %w", f.c.topic, f.c.partition, base, err)
		}
		f.left, f.base, f.baseTime, f.end = count, base, firstTime, end
		return true, nil
	}
}

// passAborted reports whether the batch is one of a transaction the
// response lists as aborted, read committed; it also follows the abort
// markers that end them (the Java consumer's rule: an aborted
// transaction's batches are passed from its first offset until its
// producer's abort marker).
func (f *LogFetch) passAborted(attrs protocol.Attributes, producer, end int64, raw []byte) bool {
	if !f.committed || producer < 0 {
		return false
	}
	for len(f.aborted) > 0 && f.aborted[0].first < end {
		if f.abortedBy == nil {
			f.abortedBy = map[int64]bool{}
		}
		f.abortedBy[f.aborted[0].producer] = true
		f.aborted = f.aborted[1:]
	}
	if attrs.Control() {
		if isAbortMarker(raw) {
			delete(f.abortedBy, producer)
		}
		return false
	}
	return attrs.Transactional() && f.abortedBy[producer]
}

// isAbortMarker reports whether a control batch's records (never
// compressed) start with an abort marker: a record whose key is a version
// and a type, type 0.
func isAbortMarker(recs []byte) bool {
	// The record's length, its attributes (a byte), then its timestamp
	// delta, offset delta and key length.
	_, n := binary.Varint(recs)
	if n <= 0 {
		return false
	}
	p := n + 1
	for range 3 {
		if p >= len(recs) {
			return false
		}
		if _, n = binary.Varint(recs[p:]); n <= 0 {
			return false
		}
		p += n
	}
	return p+4 <= len(recs) && binary.BigEndian.Uint16(recs[p+2:]) == 0
}

// decompress returns the batch's records, decompressed into the
// connection's buffer when the batch is compressed.
func (f *LogFetch) decompress(attrs protocol.Attributes, raw []byte) ([]byte, error) {
	codec := attrs.Compression().Codec()
	if attrs.Compression() == compress.None {
		return raw, nil
	}
	if codec == nil {
		return nil, fmt.Errorf("unknown compression codec %d", attrs.Compression())
	}
	r := codec.NewReader(bytes.NewReader(raw))
	defer r.Close()
	out := bytes.NewBuffer(f.c.body[:0])
	if _, err := out.ReadFrom(r); err != nil {
		return nil, err
	}
	f.c.body = out.Bytes()
	return f.c.body, nil
}

// errBadRecord is a record that does not decode.
var errBadRecord = errors.New("a record of the batch does not decode")

// nextRecord decodes the batch's next record; false when it is before the
// offset asked for.
func (f *LogFetch) nextRecord() (source.Record, bool, error) {
	p := f.recs
	f.left--
	length, n := binary.Varint(p)
	if n <= 0 || length < 0 || int64(len(p)-n) < length {
		return source.Record{}, false, f.badRecord()
	}
	rec := p[n : n+int(length)]
	f.recs = p[n+int(length):]
	q := 1 // attributes
	tsDelta, n := binary.Varint(rec[min(q, len(rec)):])
	q += n
	offDelta, m := binary.Varint(rec[min(q, len(rec)):])
	q += m
	if n <= 0 || m <= 0 {
		return source.Record{}, false, f.badRecord()
	}
	offset := f.base + offDelta
	if offset < f.from {
		return source.Record{}, false, nil
	}
	key, q, ok := varBytes(rec, q)
	if !ok {
		return source.Record{}, false, f.badRecord()
	}
	value, _, ok := varBytes(rec, q)
	if !ok {
		return source.Record{}, false, f.badRecord()
	}
	// One allocation for the key and the value: a record never aliases a
	// buffer the connection reuses.
	kv := make([]byte, len(key)+len(value))
	copy(kv, key)
	copy(kv[len(key):], value)
	out := source.Record{Time: time.UnixMilli(f.baseTime + tsDelta), Coord: source.Coord{Partition: f.c.partition, Offset: offset}}
	if key != nil {
		out.Key = kv[:len(key):len(key)]
	}
	if value != nil {
		out.Value = kv[len(key):]
	}
	if f.first < 0 {
		f.first = offset
	}
	f.next = max(f.next, offset+1)
	return out, true, nil
}

func (f *LogFetch) badRecord() error {
	f.left = 0
	return fmt.Errorf("kafka: %s/%d: the batch at offset %d: %w", f.c.topic, f.c.partition, f.base, errBadRecord)
}

// varBytes reads a varint length and that many bytes at p: nil for length
// -1.
func varBytes(b []byte, p int) ([]byte, int, bool) {
	if p > len(b) {
		return nil, p, false
	}
	n, w := binary.Varint(b[p:])
	if w <= 0 || n < -1 || int64(len(b)-p-w) < n {
		return nil, p, false
	}
	p += w
	if n < 0 {
		return nil, p, true
	}
	return b[p : p+int(n) : p+int(n)], p + int(n), true
}

// readLegacy reads a v0 or v1 message (a compressed one holds many) and
// hands it to kafka-go's decoder. Such topics have no transactions.
func (f *LogFetch) readLegacy(size int) error {
	buf := make([]byte, 4+size)
	binary.BigEndian.PutUint32(buf, uint32(size))
	if err := f.read(buf[4:]); err != nil {
		return err
	}
	var rs protocol.RecordSet
	if _, err := rs.ReadFrom(bytes.NewBuffer(buf)); err != nil {
		return fmt.Errorf("kafka: %s/%d: a v0/v1 message: %w", f.c.topic, f.c.partition, err)
	}
	f.legacy = rs.Records
	if f.legacy == nil {
		f.legacy = protocol.NewRecordReader()
	}
	return nil
}

func (f *LogFetch) nextLegacy() (source.Record, bool, error) {
	r, err := f.legacy.ReadRecord()
	if errors.Is(err, io.EOF) {
		f.legacy = nil
		return source.Record{}, false, nil
	}
	if err != nil {
		return source.Record{}, false, err
	}
	key, kerr := protocol.ReadAll(r.Key)
	value, verr := protocol.ReadAll(r.Value)
	if err := errors.Join(kerr, verr); err != nil {
		return source.Record{}, false, err
	}
	f.next = max(f.next, r.Offset+1)
	if r.Offset < f.from {
		return source.Record{}, false, nil
	}
	if f.first < 0 {
		f.first = r.Offset
	}
	return source.Record{Key: key, Value: value, Time: r.Time, Coord: source.Coord{Partition: f.c.partition, Offset: r.Offset}}, true, nil
}

// After is where the log goes on after what Next handed over: past the
// offsets that hold nothing to hand over, too.
func (f *LogFetch) After() int64 { return f.next }
