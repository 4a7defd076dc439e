package projection

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/store"
)

// queueOwnerSettle is how long an instance that tagged the queue as its
// projection's waits before it reads the tag again: two projections that
// start at once both tag it, and the one whose tag did not last is refused.
const queueOwnerSettle = 2 * time.Second

// claimQueue records the queue as the projection's and makes sure no
// other projection reads it: the queue carries the projection that reads
// it in its sqssrc.OwnerTag tag. A queue tagged for another projection
// refuses this instance (*GroupConflictError); an untagged one is tagged.
// A queue whose tags cannot be read or written (no permission, or SQS not
// answering at start) is not checked, with a warning that says which
// permissions check it.
func (p *Projector) claimQueue(ctx context.Context) error {
	cfg := p.cfg
	c, err := p.recordConsumer(ctx, store.SQSQueue, cfg.SQS.QueueURL, "", "")
	if err != nil {
		return err
	}
	if c.Previous != "" {
		cfg.Logger.Warn("the projection reads another queue than the one it recorded", "queue", c.Name, "recorded_queue", c.Previous)
	}
	ours := ownerTag(c.Identity)
	cl := p.sqs.client
	tagged := false
	for {
		owner, err := cl.Owner(ctx)
		if err != nil {
			return p.queueOwnerUnchecked(err)
		}
		switch {
		case owner != "" && owner != ours:
			return &GroupConflictError{Group: cfg.SQS.QueueURL, Queue: true, Ours: c.Identity.Name, Theirs: ownerName(owner)}
		case owner == ours && tagged:
			cfg.Logger.Info("the queue is tagged as this projection's", "tag", sqssrc.OwnerTag, "projection", c.Identity.Name)
			return nil
		case owner == ours:
			return nil
		}
		if err := cl.SetOwner(ctx, ours); err != nil {
			return p.queueOwnerUnchecked(err)
		}
		tagged = true
		sleep(ctx, queueOwnerSettle)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// queueOwnerUnchecked warns that the queue's tag could not be used, and
// goes on: an SQS that does not answer is waited out and reported by the
// receive loop.
func (p *Projector) queueOwnerUnchecked(err error) error {
	p.cfg.Logger.Warn("cannot check that no other projection reads this queue: its tags cannot be read or written (grant sqs:ListQueueTags and sqs:TagQueue on the queue to have it checked)",
		"queue", p.cfg.SQS.QueueURL, "err", err)
	return nil
}

// maxTagValue is the longest tag value SQS takes: 256 characters. A value
// of at most 256 bytes is within it however SQS counts.
const maxTagValue = 256

// ownerTag is the value of sqssrc.OwnerTag for a projection: its ID, then
// its name, cut to maxTagValue bytes on a character boundary (SQS refuses
// a value that is not UTF-8, and a refused tag turns the check off).
func ownerTag(id store.Identity) string {
	v := id.ID + " " + id.Name
	if len(v) <= maxTagValue {
		return v
	}
	n := maxTagValue
	for n > 0 && !utf8.RuneStart(v[n]) {
		n--
	}
	return v[:n]
}

// ownerName is the projection a sqssrc.OwnerTag value names.
func ownerName(tag string) string {
	id, name, ok := strings.Cut(tag, " ")
	if !ok || name == "" {
		return id
	}
	return name + " (" + id + ")"
}
