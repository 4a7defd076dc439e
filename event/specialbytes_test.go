package event

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestSpecialBytesFindsTheFirstByteThatIsNotPlain holds the eight-byte
// step of the string scan to plainByte: the lowest byte it marks is the
// first byte that is not plain, and it marks none in a word of plain
// bytes. Every byte value at every position, beside plain or random
// bytes, and a million random words.
func TestSpecialBytesFindsTheFirstByteThatIsNotPlain(t *testing.T) {
	check := func(w [8]byte) {
		want := 8
		for i, c := range w {
			if !plainByte[c] {
				want = i
				break
			}
		}
		m := specialBytes(binary.LittleEndian.Uint64(w[:]))
		got := 8
		if m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if got != want {
			t.Fatalf("word %q: first byte that is not plain at %d, specialBytes says %d", w[:], want, got)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for p := range 8 {
		for c := range 256 {
			var plain, random [8]byte
			for i := range plain {
				plain[i], random[i] = 'a', byte(rng.Uint32())
			}
			plain[p], random[p] = byte(c), byte(c)
			for i := range p {
				random[i] = 'a' + byte(i)
			}
			check(plain)
			check(random)
		}
	}
	special := []byte{0, 0x1f, '"', '\\', 0x80, 0xc3, 0xff, 0x20, 0x21, 0x7f, 0x5b, 0x5d}
	for range 1_000_000 {
		var w [8]byte
		for i := range w {
			if rng.IntN(4) == 0 {
				w[i] = special[rng.IntN(len(special))]
			} else {
				w[i] = byte(rng.Uint32())
			}
		}
		check(w)
	}
}
