package projection

import (
	"github.com/projector/projector/source"
)

// Record is one record a [Reader] delivers ([source.Record]).
type Record = source.Record

// Coord is where a record sits in its source ([source.Coord]).
type Coord = source.Coord

// Lane is one ordering scope a source hands the engine ([source.Lane]).
type Lane = source.Lane

// LaneCaps are what a lane can do ([source.LaneCaps]).
type LaneCaps = source.LaneCaps

// LaneHooks are what a reader tells the engine ([source.LaneHooks]).
type LaneHooks = source.LaneHooks

// Reader is an open lane's records ([source.Reader]).
type Reader = source.Reader

// Where a lane with no stored position starts ([source.StartFirst]).
const (
	StartFirst = source.StartFirst
	StartLast  = source.StartLast
)

// firstOffset is the offset of a batch's first record, for logs; -1 for
// none.
func firstOffset(recs []Record) int64 {
	if len(recs) == 0 {
		return -1
	}
	return recs[0].Coord.Offset
}
