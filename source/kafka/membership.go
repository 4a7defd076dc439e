package kafka

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/projector/projector/source"
	"github.com/projector/projector/source/kafka/kafkacfg"
)

// LegacyGroup and DefaultGroup name a projection's consumer group
// ([kafkacfg.LegacyGroup], [kafkacfg.DefaultGroup]).
const LegacyGroup = kafkacfg.LegacyGroup

func DefaultGroup(schema, table string) string { return kafkacfg.DefaultGroup(schema, table) }

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
	self  source.Recorded
	owns  *atomic.Bool
	inner kafkago.RangeGroupBalancer
	log   *slog.Logger
	// refused remembers the members already logged.
	mu      sync.Mutex
	refused map[string]bool
}

func (b *projectionBalancer) ProtocolName() string { return b.inner.ProtocolName() }

func (b *projectionBalancer) UserData() ([]byte, error) {
	return json.Marshal(memberData{Projection: b.self.ID, Name: b.self.Projection, Owns: b.owns.Load()})
}

func (b *projectionBalancer) AssignGroups(members []kafkago.GroupMember, partitions []kafkago.Partition) kafkago.GroupMemberAssignments {
	winner := incumbent(members, b.self.ID)
	var ours []kafkago.GroupMember
	var refused []kafkago.GroupMember
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
func incumbent(members []kafkago.GroupMember, self string) string {
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

func nameOf(members []kafkago.GroupMember, projection string) string {
	for _, m := range members {
		if d, ok := parseMemberData(m.UserData); ok && d.Projection == projection {
			return d.Name
		}
	}
	return projection
}

// conflict asks the coordinator who is in group: when members of another
// projection hold partitions of it and no member of ours does, it returns
// the *source.ConflictError that refuses this instance; nil otherwise, or
// when the group cannot be described (the join decides then).
func (g *Group) conflict(ctx context.Context, group string) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var res *kafkago.DescribeGroupsResponse
	for {
		var err error
		res, err = g.clients.Client.DescribeGroups(dctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err != nil || len(res.Groups) == 0 {
			if err != nil {
				g.log.Debug("describing the consumer group failed; the join decides", "group", group, "err", err)
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
	self := g.rec
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
	return &source.ConflictError{Group: group, Ours: self.Projection, Theirs: strings.Join(slices.Compact(theirs), ", "),
		Suggest: self.Suggest}
}
