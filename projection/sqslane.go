package projection

import (
	"context"
	"errors"
	"sync"
	"time"

	sqssrc "github.com/projector/projector/source/sqs"
)

// sqsLane is an SQS queue as a [Lane]: unfenced, no log, shared by every
// instance that receives from it.
type sqsLane struct {
	name   string
	reader *sqssrc.Reader
	// batchSize and linger bound one Fetch.
	batchSize int
	linger    time.Duration
}

var _ Lane = (*sqsLane)(nil)

// errNoLog is asked of a lane that is not a log.
var errNoLog = errors.New("projection: the lane is not a log")

func (l *sqsLane) Scope() (string, int) { return l.name, 0 }

func (l *sqsLane) Caps() LaneCaps { return LaneCaps{Shared: true} }

func (l *sqsLane) Bounds(context.Context) (int64, int64, error) { return 0, 0, errNoLog }

func (l *sqsLane) RecordAt(context.Context, int64) (Record, error) { return Record{}, errNoLog }

// Open starts the receiver; the reader's Close stops it, then makes what
// is still in flight (received, never committed) visible again.
func (l *sqsLane) Open(ctx context.Context, _, _ int64, _ LaneHooks) (Reader, error) {
	rctx, stop := context.WithCancel(ctx)
	r := &sqsLaneReader{Source: sqssrc.NewSource(l.reader, l.batchSize, l.linger), reader: l.reader, stop: stop}
	r.wg.Go(func() { l.reader.Run(rctx) })
	return r, nil
}

type sqsLaneReader struct {
	*sqssrc.Source
	reader *sqssrc.Reader
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

func (r *sqsLaneReader) Ends() (int64, int64) { return -1, -1 }

func (r *sqsLaneReader) Err() error { return r.reader.Err() }

func (r *sqsLaneReader) Close() error {
	r.stop()
	r.wg.Wait()
	return r.Source.Close()
}
