package delta

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

func TestAmountOfIsTheLiteral(t *testing.T) {
	for _, lit := range []string{"0", "7", "10", "99", "999", "1000", "-5", "1.5", "1e3", "12345678901234567890"} {
		if got := amountOf([]byte(lit)); got != lit {
			t.Errorf("amountOf(%s) = %s", lit, got)
		}
	}
}

// TestInternedPathsParseAsBefore decodes the same ops many times, with
// paths plain and escaped, and checks every decode equals the first: the
// table hands out what the parser would have made.
func TestInternedPathsParseAsBefore(t *testing.T) {
	emptyInternTable(t)
	raw := json.RawMessage(`[{"op":"increment","path":"/processed_articles","by":5},{"op":"set","path":"/a~1b/c~0d","value":1},{"op":"remove","path":"/x\/y"}]`)
	first, err := ParseOps(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"processed_articles"}, {"a/b", "c~d"}, {"x", "y"}}
	for i, op := range first {
		if !slices.Equal(op.Tokens, want[i]) {
			t.Fatalf("op %d tokens %q, want %q", i, op.Tokens, want[i])
		}
	}
	for range 3 {
		again, err := ParseOps(raw)
		if err != nil {
			t.Fatal(err)
		}
		for i := range first {
			if again[i].Path != first[i].Path || !slices.Equal(again[i].Tokens, first[i].Tokens) || again[i].By != first[i].By {
				t.Fatalf("op %d decoded again as %+v, first %+v", i, again[i], first[i])
			}
		}
	}
	if _, ok := internedPathOf([]byte(`"/processed_articles"`)); !ok {
		t.Fatal("a path decoded before is not in the table")
	}
	// A bad path is refused every time, never remembered.
	for range 2 {
		if _, err := ParseOps(json.RawMessage(`[{"op":"remove","path":"/a~2"}]`)); err == nil {
			t.Fatal("a bad escape was accepted")
		}
	}
	if _, ok := internedPathOf([]byte(`"/a~2"`)); ok {
		t.Fatal("a refused path is in the table")
	}
}

func TestInternTableIsBounded(t *testing.T) {
	emptyInternTable(t)
	for i := range maxInternedPaths + 100 {
		raw := fmt.Sprintf(`[{"op":"remove","path":"/bounded-%d"}]`, i)
		ops, err := ParseOps(json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("bounded-%d", i); ops[0].Tokens[0] != want {
			t.Fatalf("path %d parsed as %q", i, ops[0].Tokens[0])
		}
	}
	if n := len(*paths.Load()); n > maxInternedPaths {
		t.Fatalf("the table holds %d paths, bound %d", n, maxInternedPaths)
	}
}

// emptyInternTable empties the process's path table for a test and puts
// it back after: what other tests interned must not decide what this one
// finds, nor the other way round.
func emptyInternTable(t *testing.T) {
	saved := paths.Load()
	paths.Store(nil)
	t.Cleanup(func() { paths.Store(saved) })
}
