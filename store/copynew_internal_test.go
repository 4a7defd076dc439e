package store

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestNewRowsBufferIsAboutOneRead: the stream copyNew sends keeps about one
// read of rows (and the largest row) in its buffer, whatever the number of
// rows: a read that ends inside a row must not leave the buffer growing by
// a read each time until it holds the whole copy.
func TestNewRowsBufferIsAboutOneRead(t *testing.T) {
	const read = 65531 // what pgconn asks for at a time
	ws := make([]Write, 20000)
	total := 0
	for i := range ws {
		state := fmt.Sprintf(`{"i": %d, "note": "%s"}`, i, strings.Repeat("x", 100+i%83))
		ws[i] = Write{JobID: fmt.Sprintf("job-%d", i), Version: 1, State: json.RawMessage(state), EventID: "e"}
		total += len(state)
	}
	r := &newRows{ws: ws, topic: "t"}
	p := make([]byte, read)
	most, sent := 0, 0
	for {
		n, err := r.Read(p)
		sent += n
		most = max(most, cap(r.buf))
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if sent < total {
		t.Fatalf("sent %d bytes, fewer than the states' %d", sent, total)
	}
	if most > 2*read+1024 {
		t.Fatalf("the buffer grew to %d bytes for a stream of %d read %d at a time", most, sent, read)
	}
}
