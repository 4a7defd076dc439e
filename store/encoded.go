package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// its text (Conn.Prepare with the SQL as its name), prepared once a
// connection as pgx's statement cache would (encodedRows drops it again
// where pgx's cache would).

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

// query runs one of a batch's statements: through [queryEncoded], or
// tx.Query where the pool's connections trace their queries or do not
// prepare and cache statements (default_query_exec_mode).
func (s *Store) query(ctx context.Context, tx pgx.Tx, sql string, args ...any) (pgx.Rows, error) {
	if s.directQuery {
		return tx.Query(ctx, sql, args...)
	}
	return queryEncoded(ctx, tx, sql, args...)
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
	if p.buf == nil {
		// Never nil once encoding starts: the encoders tell NULL by a nil
		// result, and an empty value appended to a nil buffer is nil.
		p.buf = make([]byte, 0, 4096)
	}
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
	return &encodedRows{Rows: pgx.RowsFromResultReader(m, rr), conn: conn, sql: sql}, nil
}

// encodedRows are a statement's rows that recover, as pgx's statement
// cache does for tx.Query, from the errors a prepared statement fails with
// every time until it is prepared again. 26000 (it does not exist): the
// server lost the session's statements (DISCARD ALL, a pooler's other
// server connection), pgx's own cached ones too, so the connection is
// closed and the pool opens another. 0A000 (cached plan must not change
// result type): this statement is dropped and the next attempt prepares
// it again. Any other failure keeps it. The caller must close the rows,
// as pgx's helpers (CollectRows, ForEachRow, CollectOneRow) do.
type encodedRows struct {
	pgx.Rows
	conn    *pgx.Conn
	sql     string
	dropped bool
}

func (r *encodedRows) Close() {
	r.Rows.Close()
	if r.dropped {
		return
	}
	var pgErr *pgconn.PgError
	if !errors.As(r.Rows.Err(), &pgErr) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch pgErr.Code {
	case "26000":
		r.dropped = true
		_ = r.conn.Close(ctx)
	case "0A000":
		r.dropped = true
		if r.conn.Deallocate(ctx, r.sql) != nil {
			// pgx keeps it as prepared when the server was not told:
			// closed, the connection takes it along.
			_ = r.conn.Close(ctx)
		}
	}
}
