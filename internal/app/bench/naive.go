package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/app/broker"
)

// naive is what a team writes first: a kafka-go group Reader, one
// conditional upsert per event (a delta reads the row, applies its ops and
// writes where the row is still at the version before), CommitMessages
// after each. It handles no gap: a delta whose row is not at the version
// before is skipped, so it does less than the contract asks. Timed from
// the first message (the group join is not counted) over a bounded sample.
func naive(ctx context.Context, r *run, topic string) (Writer, error) {
	n := min(r.cfg.NaiveSample, r.rep.Events)
	w := Writer{Name: "naive: group Reader, an upsert and a commit per event", Events: n,
		Note: fmt.Sprintf("sample of %d events; skips gaps", n)}
	t, err := table(ctx, r.pool, r.schema, "naive")
	if err != nil {
		return w, err
	}
	rd := kafka.NewReader(kafka.ReaderConfig{
		Brokers: r.broker.addrs, GroupID: "bench-naive", Topic: topic, MaxWait: 100 * time.Millisecond,
		HeartbeatInterval: broker.GroupHeartbeatInterval, SessionTimeout: broker.GroupSessionTimeout,
		RebalanceTimeout: broker.GroupRebalanceTimeout, JoinGroupBackoff: broker.GroupJoinBackoff,
	})
	defer rd.Close()
	var start time.Time
	for i := 0; i < n; i++ {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			return w, err
		}
		if i == 0 {
			start = time.Now()
		}
		ev, err := event.Decode(m.Key, m.Value)
		if err != nil {
			return w, err
		}
		switch ev.Kind {
		case event.Snapshot:
			_, err = r.pool.Exec(ctx, `INSERT INTO `+t+guarded, ev.JobID, ev.Version, string(ev.State))
		case event.Delta:
			err = naiveDelta(ctx, r, t, ev)
		}
		if err != nil {
			return w, fmt.Errorf("%s v%d: %w", ev.JobID, ev.Version, err)
		}
		if err := rd.CommitMessages(ctx, m); err != nil {
			return w, err
		}
	}
	w.Seconds = time.Since(start).Seconds()
	_, err = r.pool.Exec(ctx, `DROP TABLE `+t)
	return w, err
}

func naiveDelta(ctx context.Context, r *run, t string, ev event.Event) error {
	var version int64
	var raw []byte
	err := r.pool.QueryRow(ctx, `SELECT version, state::text FROM `+t+` WHERE job_id = $1`, ev.JobID).Scan(&version, &raw)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && version != ev.Version-1) {
		return nil // a gap or a late delta: the naive consumer moves on
	}
	if err != nil {
		return err
	}
	state, err := delta.DecodeState(raw)
	if err != nil {
		return err
	}
	next, err := delta.Apply(state, ev.Ops)
	if err != nil {
		return err
	}
	out, err := delta.EncodeState(next)
	if err != nil {
		return err
	}
	_, err = r.pool.Exec(ctx, `UPDATE `+t+` SET version = $2, state = $3::jsonb, updated_at = now() WHERE job_id = $1 AND version = $4`,
		ev.JobID, ev.Version, string(out), ev.Version-1)
	return err
}
