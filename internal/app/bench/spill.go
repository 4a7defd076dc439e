package bench

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/projector/projector/event"
)

// spill is the stream's events, decoded (partition, job id, version, and
// the state of a snapshot or the ops of a delta), in an unlinked temporary file: written
// once while the stream is produced, and read back by the baselines a
// buffer at a time, so that the bench never holds every event.
type spill struct {
	f    *os.File
	w    *bufio.Writer
	size int64
	n    int
	buf  []byte
}

func newSpill() (*spill, error) {
	f, err := os.CreateTemp("", "projector-bench-*.events")
	if err != nil {
		return nil, fmt.Errorf("bench: spill file: %w", err)
	}
	// Unlinked at once: the file goes with the process, however it ends.
	_ = os.Remove(f.Name())
	return &spill{f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

// add appends an event of partition p.
func (s *spill) add(p int, ev event.Event) error {
	b := binary.AppendUvarint(s.buf[:0], uint64(p))
	b = binary.AppendUvarint(b, uint64(len(ev.JobID)))
	b = append(b, ev.JobID...)
	b = binary.AppendVarint(b, ev.Version)
	body := ev.State
	if ev.Kind != event.Snapshot {
		body = ev.RawOps
	}
	b = binary.AppendUvarint(b, uint64(len(body)))
	b = append(b, body...)
	s.buf = b
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("bench: spill file: %w", err)
	}
	s.size += int64(len(b))
	s.n++
	return nil
}

// done ends the writing.
func (s *spill) done() error {
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("bench: spill file: %w", err)
	}
	return nil
}

func (s *spill) close() { _ = s.f.Close() }

// rows reads the events back from the first, as pgx's CopyFromSource.
func (s *spill) rows() *spillRows {
	return &spillRows{r: bufio.NewReaderSize(io.NewSectionReader(s.f, 0, s.size), 1<<20)}
}

// spillRows reads a spill's events one by one.
type spillRows struct {
	r         *bufio.Reader
	buf       []byte
	partition int
	jobID     string
	version   int64
	body      string
	err       error
}

// Next reads the next event; false at the end or on an error (see Err).
func (s *spillRows) Next() bool {
	if s.err != nil {
		return false
	}
	p, err := binary.ReadUvarint(s.r)
	if errors.Is(err, io.EOF) {
		return false
	}
	s.partition = int(p)
	var n uint64
	if err == nil {
		n, err = binary.ReadUvarint(s.r)
	}
	if err == nil {
		s.jobID, err = s.str(n)
	}
	if err == nil {
		s.version, err = binary.ReadVarint(s.r)
	}
	if err == nil {
		n, err = binary.ReadUvarint(s.r)
	}
	if err == nil {
		s.body, err = s.str(n)
	}
	if err != nil {
		s.err = fmt.Errorf("bench: spill file: %w", err)
		return false
	}
	return true
}

func (s *spillRows) str(n uint64) (string, error) {
	if uint64(cap(s.buf)) < n {
		s.buf = make([]byte, n)
	}
	b := s.buf[:n]
	if _, err := io.ReadFull(s.r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// Values is the event as raw COPY's row: job id, version, body.
func (s *spillRows) Values() ([]any, error) { return []any{s.jobID, s.version, s.body}, nil }

func (s *spillRows) Err() error { return s.err }
