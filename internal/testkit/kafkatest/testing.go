package kafkatest

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// New starts a [Cluster] for t and closes it when t ends; it fails t if the
// broker cannot start.
func New(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	c, err := Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var topicSeq atomic.Int64

// Topic creates a topic with the given partitions on c, named after t and
// unique within the process, and returns its name; it fails t if the topic
// cannot be created within 10 s.
func Topic(t testing.TB, c *Cluster, partitions int) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", topicName(t.Name()), topicSeq.Add(1))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.CreateTopic(ctx, name, partitions); err != nil {
		t.Fatal(err)
	}
	return name
}

// topicName maps a test name onto Kafka's topic alphabet ([a-zA-Z0-9._-],
// at most 249 characters), leaving room for the sequence suffix.
func topicName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		default:
			return '_'
		}
	}, s)
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
