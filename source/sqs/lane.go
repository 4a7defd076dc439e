package sqs

import (
	"context"
	"sync"
	"time"

	"github.com/projector/projector/source"
)

// Lane is an SQS queue as a [source.Lane]: unfenced, no log, shared by
// every instance that receives from it.
type Lane struct {
	name   string
	reader *Reader
	// batchSize and linger bound one Fetch.
	batchSize int
	linger    time.Duration
}

// NewLane is the queue r receives from as a lane whose rows are stored
// under name, read in batches of up to batchSize messages gathered for up
// to linger after the first.
func NewLane(name string, r *Reader, batchSize int, linger time.Duration) *Lane {
	return &Lane{name: name, reader: r, batchSize: batchSize, linger: linger}
}

var _ source.Lane = (*Lane)(nil)

func (l *Lane) Scope() (string, int) { return l.name, 0 }

func (l *Lane) Caps() source.LaneCaps { return source.LaneCaps{Shared: true} }

func (l *Lane) Bounds(context.Context) (int64, int64, error) { return 0, 0, source.ErrNoLog }

func (l *Lane) RecordAt(context.Context, int64) (source.Record, error) {
	return source.Record{}, source.ErrNoLog
}

// Open starts the receiver; the reader's Close stops it, then makes what
// is still in flight (received, never committed) visible again. The
// receiver runs until Close, not until ctx ends: a batch that commits
// while the engine stops is acknowledged before Close, and its messages
// stay in flight, kept invisible, until then.
func (l *Lane) Open(ctx context.Context, _, _ int64, _ source.LaneHooks) (source.Reader, error) {
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r := &laneReader{Source: NewSource(l.reader, l.batchSize, l.linger), stop: stop}
	r.wg.Go(func() { l.reader.Run(rctx) })
	return r, nil
}

// laneReader is the queue's [Source] with its receiver running.
type laneReader struct {
	*Source
	stop context.CancelFunc
	wg   sync.WaitGroup
}

func (r *laneReader) Close() error {
	r.stop()
	r.wg.Wait()
	return r.Source.Close()
}
