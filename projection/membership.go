package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/segmentio/kafka-go"

	sqssrc "github.com/projector/projector/source/sqs"
	"github.com/projector/projector/store"
)

// LegacyGroup is the consumer group every projection joined by default
// before each recorded its own: a projection that has positions and no
// recorded group keeps it.
const LegacyGroup = "projector"

// DefaultGroup is the consumer group a new projection records when none
// is given: one per projection, so two projections never split a topic's
// partitions between them.
func DefaultGroup(schema, table string) string { return "projector-" + schema + "." + table }

// QueueOwnerTag is the SQS queue tag that names the projection whose
// instances receive from the queue (its [store.Identity] ID and name).
const QueueOwnerTag = sqssrc.OwnerTag

// GroupConflictError is a consumer group, or an SQS queue, that another
// projection's instances already work: this instance was refused rather
// than take part of what the other projection reads. The operator must
// give this projection a group (or queue) of its own.
type GroupConflictError struct {
	// Group is the consumer group, or the queue.
	Group string
	// Ours and Theirs name the two projections.
	Ours, Theirs string
	// Queue says Group is an SQS queue.
	Queue bool
	// Suggest is a group of this projection's own.
	Suggest string
}

func (e *GroupConflictError) Error() string {
	if e.Queue {
		return fmt.Sprintf("the SQS queue %s is read by another projection (%s); this one (%s) would receive only part of its messages and the other would miss them: give each projection a queue of its own (if %s no longer runs, remove the queue's tag %s)",
			e.Group, e.Theirs, e.Ours, e.Theirs, QueueOwnerTag)
	}
	return fmt.Sprintf("consumer group %q is used by another projection (%s); this one (%s) would split the topic's partitions with it and both read models would miss records: give this projection a group of its own with --group (for example %s)",
		e.Group, e.Theirs, e.Ours, e.Suggest)
}

// memberData is what an instance tells the group about itself, in its
// JoinGroup metadata (read by the group's leader and by DescribeGroups).
type memberData struct {
	// Projection is the projection's [store.Identity] ID; Name how
	// people name it.
	Projection string `json:"projection"`
	Name       string `json:"name"`
	// Owns says the instance has been working partitions of the group.
	Owns bool `json:"owns"`
}

func parseMemberData(b []byte) (memberData, bool) {
	var d memberData
	if len(b) == 0 || json.Unmarshal(b, &d) != nil || d.Projection == "" {
		// An instance from before members said who they project, or
		// another client: nothing to refuse it on.
		return memberData{}, false
	}
	return d, true
}

// projectionBalancer assigns the group's partitions only to the members
// that project what the group's incumbent projects: the projection whose
// members own partitions already, else the leader's own. Members of any
// other projection are assigned nothing and find out they were refused
// ([refusedBy]). Members that do not say what they project (earlier
// versions) are assigned with the incumbent's. The protocol is kafka-go's
// range balancer's, so earlier versions in the group agree on it during a
// rolling upgrade.
type projectionBalancer struct {
	self  store.Identity
	owns  *atomic.Bool
	inner kafka.RangeGroupBalancer
	log   *slog.Logger
	// refused remembers the members already logged.
	mu      sync.Mutex
	refused map[string]bool
}

func (b *projectionBalancer) ProtocolName() string { return b.inner.ProtocolName() }

func (b *projectionBalancer) UserData() ([]byte, error) {
	return json.Marshal(memberData{Projection: b.self.ID, Name: b.self.Name, Owns: b.owns.Load()})
}

func (b *projectionBalancer) AssignGroups(members []kafka.GroupMember, partitions []kafka.Partition) kafka.GroupMemberAssignments {
	winner := incumbent(members, b.self.ID)
	var ours []kafka.GroupMember
	var refused []kafka.GroupMember
	for _, m := range members {
		if d, ok := parseMemberData(m.UserData); ok && d.Projection != winner {
			refused = append(refused, m)
			continue
		}
		ours = append(ours, m)
	}
	out := b.inner.AssignGroups(ours, partitions)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range refused {
		out[m.ID] = map[string][]int{}
		if !b.refused[m.ID] {
			if b.refused == nil || len(b.refused) > 1000 {
				b.refused = map[string]bool{}
			}
			b.refused[m.ID] = true
			d, _ := parseMemberData(m.UserData)
			b.log.Error("a member of the consumer group projects elsewhere; it is assigned no partition and will stop",
				"member", m.ID, "its_projection", d.Name, "group_projection", nameOf(members, winner))
		}
	}
	return out
}

// incumbent is the projection the group's partitions go to: the one whose
// members own partitions already (the leader's own if several do), else
// the leader's.
func incumbent(members []kafka.GroupMember, self string) string {
	var owners []string
	for _, m := range members {
		if d, ok := parseMemberData(m.UserData); ok && d.Owns {
			if d.Projection == self {
				return self
			}
			owners = append(owners, d.Projection)
		}
	}
	if len(owners) == 0 {
		return self
	}
	sort.Strings(owners)
	return owners[0]
}

func nameOf(members []kafka.GroupMember, projection string) string {
	for _, m := range members {
		if d, ok := parseMemberData(m.UserData); ok && d.Projection == projection {
			return d.Name
		}
	}
	return projection
}

// groupConflict asks the coordinator who is in group: when members of
// another projection hold partitions of it and no member of ours does, it
// returns the *GroupConflictError that refuses this instance; nil
// otherwise, or when the group cannot be described (the join decides then).
func (p *Projector) groupConflict(ctx context.Context, group string) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var res *kafka.DescribeGroupsResponse
	for {
		var err error
		res, err = p.kafka.Client.DescribeGroups(dctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err != nil || len(res.Groups) == 0 {
			if err != nil {
				p.cfg.Logger.Debug("describing the consumer group failed; the join decides", "group", group, "err", err)
			}
			return nil
		}
		// Mid-rebalance, the members' assignments are not settled yet:
		// ask again shortly.
		if st := res.Groups[0].GroupState; st != "PreparingRebalance" && st != "CompletingRebalance" {
			break
		}
		sleep(dctx, 200*time.Millisecond)
		if dctx.Err() != nil {
			return nil
		}
	}
	self := p.identity
	var theirs []string
	oursHold := false
	for _, m := range res.Groups[0].Members {
		d, ok := parseMemberData(m.MemberMetadata.UserData)
		holds := false
		for _, t := range m.MemberAssignments.Topics {
			holds = holds || len(t.Partitions) > 0
		}
		switch {
		case !ok:
		case d.Projection == self.ID:
			oursHold = oursHold || holds
		case holds:
			theirs = append(theirs, d.Name)
		}
	}
	if oursHold || len(theirs) == 0 {
		return nil
	}
	sort.Strings(theirs)
	return &GroupConflictError{Group: group, Ours: self.Name, Theirs: strings.Join(slices.Compact(theirs), ", "),
		Suggest: p.ownGroup()}
}

// recordGroup resolves the consumer group this instance joins (the
// configured one, else the one the projection recorded, else its
// default) and records it, so every instance of the projection joins the
// same one.
func (p *Projector) recordGroup(ctx context.Context) error {
	cfg := p.cfg
	st := cfg.Store
	c, err := p.recordConsumer(ctx, store.KafkaGroup, cfg.Group, DefaultGroup(st.Schema(), st.Projection()), LegacyGroup)
	if err != nil {
		return err
	}
	p.group.Store(&c.Name)
	switch {
	case c.Previous != "":
		cfg.Logger.Warn("the projection moves to another consumer group: instances still in the one it recorded claim its partitions too until they are restarted with this --group",
			"group", c.Name, "recorded_group", c.Previous)
	case c.Legacy:
		cfg.Logger.Info("the projection keeps the consumer group it ran in before groups were recorded", "group", c.Name)
	}
	return nil
}

// recordConsumer records the projection's consumer group or queue (see
// [store.Store.RecordConsumer]), waiting out the database, and sets the
// projection's identity; one another projection of the schema recorded is
// a *GroupConflictError.
func (p *Projector) recordConsumer(ctx context.Context, src store.ConsumerSource, explicit, fresh, legacy string) (store.Consumer, error) {
	var c store.Consumer
	err := p.retryDatabase(ctx, func() error {
		var err error
		c, err = p.cfg.Store.RecordConsumer(ctx, src, explicit, fresh, legacy)
		var taken *store.ConsumerTakenError
		if errors.As(err, &taken) {
			ge := &GroupConflictError{Group: taken.Consumer, Ours: taken.Identity.Name, Theirs: taken.Projection, Queue: src == store.SQSQueue}
			if !ge.Queue {
				ge.Suggest = p.ownGroup()
			}
			return backoff.Permanent(ge)
		}
		return err
	})
	if err != nil {
		return store.Consumer{}, err
	}
	p.identity = c.Identity
	return c, nil
}

// retryDatabase runs op until it succeeds or ctx ends, reporting each
// failure as the database's, as a worker does.
func (p *Projector) retryDatabase(ctx context.Context, op func() error) error {
	bo := retryPolicy()
	for {
		err := op()
		if err == nil {
			p.databaseAnswered()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var perm *backoff.PermanentError
		if errors.As(err, &perm) {
			return perm.Err
		}
		d := bo.NextBackOff()
		p.databaseFailed(err, d)
		p.dbOutage.wait(ctx, d)
	}
}

// ownGroup is a consumer group of this projection's own, to suggest: a
// rebuild's shadow names the rebuild's group.
func (p *Projector) ownGroup() string {
	st := p.cfg.Store
	if table, ok := strings.CutPrefix(st.Projection(), store.ShadowPrefix); ok {
		return "projector-rebuild-" + st.Schema() + "-" + table
	}
	return DefaultGroup(st.Schema(), st.Projection())
}

// groupName is the consumer group this instance joins (the configured one
// until [Projector.recordGroup] resolved it).
func (p *Projector) groupName() string {
	if g := p.group.Load(); g != nil {
		return *g
	}
	return p.cfg.Group
}
