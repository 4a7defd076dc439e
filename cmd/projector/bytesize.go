package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag of a number of bytes, written as a whole number with
// an optional unit: 67108864, 64MiB, 512KiB, 1GiB (also KB, MB, GB as
// powers of 1000).
type byteSize int64

var byteUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"B", 1},
}

func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		factor int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.factor == 0 {
			return fmt.Sprintf("%d%s", n/u.factor, u.suffix)
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	factor := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, factor = strings.TrimSpace(rest), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return errors.New("want a number of bytes such as 64MiB, 512KiB or 67108864")
	}
	if n > (1<<62)/factor {
		return errors.New("too large")
	}
	*b = byteSize(n * factor)
	return nil
}

// Get makes it a flag.Getter.
func (b *byteSize) Get() any { return *b }
