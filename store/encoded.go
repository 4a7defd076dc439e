package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A batch's statements carry its rows as arrays: a few hundred KB of
// parameters each. pgx encodes a query's parameters into a buffer of its
// own that it starts again at 256 bytes for every query and grows by
// doubling, so each statement made about twice its parameters in garbage
// before the protocol message copied them once more: the largest part of
// what a batch allocated at 200,000 jobs, and so of the collector's work.
// queryEncoded encodes them with the connection's own type map (the same
// encoders, the same binary format) into a buffer kept from one statement
// to the next, and runs the statement prepared under pgx's own name for
// its text (Conn.Prepare with the SQL as its name), as pgx's statement
// cache would.

// paramBufs keeps the parameter buffers between statements: a channel, not
// a sync.Pool, whose contents every other collection drops, and the
// collector runs often where this matters.
var paramBufs = make(chan *encodedParams, 16)

// maxKeptParams is the largest buffer kept for another statement: a
// statement is cut at 256 KiB of ids, states and ops ([inChunks]), so
// larger ones are rare (a single large state) and go.
const maxKeptParams = 1 << 20

type encodedParams struct {
	buf     []byte
	values  [][]byte
	formats []int16
	results []int16
}

func getParams() *encodedParams {
	select {
	case p := <-paramBufs:
		return p
	default:
		return &encodedParams{}
	}
}

func putParams(p *encodedParams) {
	if cap(p.buf) > maxKeptParams {
		return
	}
	clear(p.values) // keeps no batch's bytes alive
	p.buf, p.values, p.formats, p.results = p.buf[:0], p.values[:0], p.formats[:0], p.results[:0]
	select {
	case paramBufs <- p:
	default:
	}
}

// queryEncoded is tx.Query(ctx, sql, args...) with the parameters encoded
// into a kept buffer (see above). The rows are read as tx.Query's are.
func queryEncoded(ctx context.Context, tx pgx.Tx, sql string, args ...any) (pgx.Rows, error) {
	conn := tx.Conn()
	sd, err := conn.Prepare(ctx, sql, sql)
	if err != nil {
		return nil, err
	}
	if len(sd.ParamOIDs) != len(args) {
		return nil, fmt.Errorf("store: a statement of %d parameters given %d", len(sd.ParamOIDs), len(args))
	}
	m := conn.TypeMap()
	p := getParams()
	defer putParams(p)
	ends := make([]int, len(args))
	for i, a := range args {
		format := m.FormatCodeForOID(sd.ParamOIDs[i])
		buf, err := m.Encode(sd.ParamOIDs[i], format, a, p.buf)
		if err != nil {
			return nil, fmt.Errorf("store: encode parameter $%d: %w", i+1, err)
		}
		p.formats = append(p.formats, format)
		if buf == nil { // NULL
			ends[i] = -1
			continue
		}
		p.buf = buf
		ends[i] = len(p.buf)
	}
	start := 0
	for _, end := range ends {
		if end < 0 {
			p.values = append(p.values, nil)
			continue
		}
		p.values = append(p.values, p.buf[start:end:end])
		start = end
	}
	for _, f := range sd.Fields {
		p.results = append(p.results, m.FormatCodeForOID(f.DataTypeOID))
	}
	// The parameters are sent once ExecStatement returns: the buffer may
	// serve the next statement.
	rr := conn.PgConn().ExecStatement(ctx, sd, p.values, p.formats, p.results)
	return pgx.RowsFromResultReader(m, rr), nil
}
