package kafka

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	kafkago "github.com/segmentio/kafka-go"
)

// A fetch response's framing, up to the partition's record set, and the
// reads of its fields ([logFetch]); kafkadecode.go reads the record set.

// readHeader reads the response up to the partition's record set. A
// partition error code is returned as a kafkago.Error once the response is
// read.
func (f *LogFetch) readHeader() error {
	c := f.c
	var head [8]byte
	if _, err := io.ReadFull(c.r, head[:]); err != nil {
		return err
	}
	f.remain = int(int32(binary.BigEndian.Uint32(head[:4]))) - 4
	if id := int32(binary.BigEndian.Uint32(head[4:])); id != c.corr {
		return fmt.Errorf("kafka: fetch answered with correlation id %d, %d asked", id, c.corr)
	}
	if f.remain < 0 {
		return fmt.Errorf("kafka: fetch response of %d bytes", f.remain+8)
	}
	v := c.fetchVersion
	var code int16
	_ = f.skip(4) // throttle time
	if v >= 7 {
		code = f.int16()
		_ = f.skip(4) // session id
	}
	for range f.count() {
		topic := f.string()
		for range f.count() {
			partition := f.int32()
			pcode := f.int16()
			hwm := f.int64()
			lso := f.int64()
			if v >= 5 {
				_ = f.skip(8) // log start offset
			}
			var aborted []abortedTxn
			for range f.count() {
				aborted = append(aborted, abortedTxn{producer: f.int64(), first: f.int64()})
			}
			if v >= 11 {
				_ = f.skip(4) // preferred read replica
			}
			size := int(f.int32())
			if f.err != nil {
				return f.err
			}
			ours := topic == c.topic && int(partition) == c.partition
			if !ours || pcode != 0 || code != 0 {
				_ = f.skip(size)
				if ours && code == 0 {
					code = pcode
				}
				continue
			}
			f.HighWatermark, f.LastStable = hwm, lso
			slices.SortFunc(aborted, func(a, b abortedTxn) int { return cmp.Compare(a.first, b.first) })
			f.aborted = aborted
			// The record set is the response's last field: what is left
			// of the response is records.
			if max(size, 0) != f.remain {
				return fmt.Errorf("kafka: fetch response for more than %s/%d", c.topic, c.partition)
			}
			return nil
		}
	}
	if f.err != nil {
		return f.err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if code != 0 {
		return kafkago.Error(code)
	}
	return fmt.Errorf("kafka: fetch response without %s/%d", c.topic, c.partition)
}

// Reading the response: the first error sticks, and every read counts
// against what is left of the response (and of its record set).

func (f *LogFetch) read(b []byte) error {
	if f.err != nil {
		return f.err
	}
	if len(b) > f.remain {
		f.err = fmt.Errorf("kafka: fetch response shorter than its fields")
		return f.err
	}
	n, err := io.ReadFull(f.c.r, b)
	f.remain -= n
	if err != nil {
		f.err = err
	}
	return f.err
}

// skip discards n bytes of the response.
func (f *LogFetch) skip(n int) error {
	if f.err != nil || n <= 0 {
		return f.err
	}
	if n > f.remain {
		f.err = fmt.Errorf("kafka: fetch response shorter than its fields")
		return f.err
	}
	d, err := f.c.r.Discard(n)
	f.remain -= d
	if err != nil {
		f.err = err
	}
	return f.err
}

func (f *LogFetch) int16() int16 {
	var b [2]byte
	_ = f.read(b[:])
	return int16(binary.BigEndian.Uint16(b[:]))
}

func (f *LogFetch) int32() int32 {
	var b [4]byte
	_ = f.read(b[:])
	return int32(binary.BigEndian.Uint32(b[:]))
}

func (f *LogFetch) int64() int64 {
	var b [8]byte
	_ = f.read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]))
}

func (f *LogFetch) string() string {
	n := f.int16()
	if n <= 0 || f.err != nil {
		return ""
	}
	b := make([]byte, n)
	_ = f.read(b)
	return string(b)
}

// count reads an array's length: 0 for a null array, and after an error.
func (f *LogFetch) count() int {
	n := int(f.int32())
	if f.err != nil || n < 0 {
		return 0
	}
	return n
}
