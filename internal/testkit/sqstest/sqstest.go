// Package sqstest is the testing.TB side of internal/app/sqsemu: [New] starts
// the SQS emulator for a test and stops it at the test's end, [Queue]
// creates a FIFO queue named after the test.
//
// Only tests import it: it links the testing package.
package sqstest

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projector/projector/internal/app/sqsemu"
)

// New starts the emulator for t and stops it when t ends. A missing
// Node.js or emulator package fails t with how to install them.
func New(t testing.TB) *sqsemu.Emulator {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	e, err := sqsemu.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

var queueSeq atomic.Int64

// Queue creates a FIFO queue on e, named after t and unique within the
// process, with the given visibility timeout, and returns its URL.
func Queue(t testing.TB, e *sqsemu.Emulator, visibility time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	url, err := e.CreateFIFO(ctx, fmt.Sprintf("%s-%d", queueName(t.Name()), queueSeq.Add(1)), visibility)
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// queueName maps a test name onto SQS's queue name alphabet
// ([a-zA-Z0-9_-], at most 80 characters with ".fifo").
func queueName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		default:
			return '_'
		}
	}, s)
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}
