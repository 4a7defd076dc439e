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

// queryEncoded is tx.Query(ctx, sql, args...) with the parameters encoded
// into a kept buffer (see above). The rows are read as tx.Query's are. A
// connection with a query tracer, or whose statements are not prepared
// and cached (default_query_exec_mode), goes through tx.Query as before.
func queryEncoded(ctx context.Context, tx pgx.Tx, sql string, args ...any) (pgx.Rows, error) {
	conn := tx.Conn()
	if cfg := conn.Config(); cfg.Tracer != nil || cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return tx.Query(ctx, sql, args...)
	}
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

// encodedRows are a statement's rows that, when the statement failed
// because the server no longer has it as prepared (or its plan changed
// its result's type), drop it from the connection, so that the batch's
// next attempt prepares it again; pgx's statement cache does the same for
// tx.Query. Any other failure keeps it.
type encodedRows struct {
	pgx.Rows
	conn    *pgx.Conn
	sql     string
	dropped bool
}

func (r *encodedRows) Close() {
	r.Rows.Close()
	if r.dropped || !staleStatement(r.Rows.Err()) {
		return
	}
	r.dropped = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Deallocate forgets the statement on the client even if the server
	// cannot be told (it then closes the connection, whose statements go
	// with it).
	_ = r.conn.Deallocate(ctx, r.sql)
}

// staleStatement reports an error that a prepared statement fails with
// every time until it is prepared again: 26000 (it does not exist, as
// after DISCARD ALL or a pooler's reconnection) or 0A000 (cached plan must
// not change result type).
func staleStatement(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "0A000")
}
