package jobgen_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/internal/testkit/pgtest"
)

// TestTruthIsTheFoldOfEveryVersion replays each job's events in version
// order from {} and checks the reference model is what it gives.
func TestTruthIsTheFoldOfEveryVersion(t *testing.T) {
	t.Parallel()
	for _, shape := range jobgen.Shapes {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			truthIsTheFold(t, shape)
		})
	}
}

func truthIsTheFold(t *testing.T, shape string) {
	s := jobgen.Generate(jobgen.Config{Seed: 9, Jobs: 300, Shape: shape, DuplicateRate: 0.2, LateRate: 0.2, MisrouteRate: 0.1, BadRate: 0.1, DeleteRate: 0.2})
	require.Positive(t, s.Faults.Deleted, "some jobs end deleted")
	require.Positive(t, s.Faults.Recreated, "some jobs are deleted and created again")
	byJob := map[string][]event.Event{}
	bad := 0
	for _, r := range s.Records {
		ev, err := event.Decode(r.Key, r.Value)
		if err != nil {
			require.Equal(t, "bad", r.Fault, "only injected bad records fail to decode: %s", r.Value)
			bad++
			continue
		}
		if r.Fault == "misrouted" {
			require.NotEqual(t, jobgen.PartitionOf(ev.JobID, 6), r.Partition)
		} else {
			require.Equal(t, jobgen.PartitionOf(ev.JobID, 6), r.Partition)
		}
		byJob[ev.JobID] = append(byJob[ev.JobID], ev)
	}
	require.Equal(t, s.Faults.Bad, bad)
	require.Len(t, byJob, 300)
	for id, evs := range byJob {
		sort.SliceStable(evs, func(i, j int) bool { return evs[i].Version < evs[j].Version })
		state := map[string]any{}
		var v int64
		deleted := false
		for _, ev := range evs {
			if ev.Version == v {
				continue // a duplicate delivery
			}
			require.Equal(t, v+1, ev.Version, "%s: no missing versions without MissingRate", id)
			var err error
			switch ev.Kind {
			case event.Snapshot:
				state, err = delta.DecodeState(ev.State)
			case event.Delete:
				state = nil
			default:
				require.False(t, deleted, "%s: a delta follows a delete", id)
				state, err = delta.Apply(state, ev.Ops)
			}
			require.NoError(t, err)
			v, deleted = ev.Version, ev.Kind == event.Delete
		}
		require.Equal(t, s.Truth[id].Version, v, id)
		require.Equal(t, s.Truth[id].Deleted, deleted, id)
		if deleted {
			require.Nil(t, s.Truth[id].State, "%s: a deleted job has no state", id)
			continue
		}
		raw, err := delta.EncodeState(state)
		require.NoError(t, err)
		require.True(t, delta.SameState(s.Truth[id].State, raw), "%s: %s vs %s", id, s.Truth[id].State, raw)
	}
}

func TestMissingDeltasNeverTheLastEvent(t *testing.T) {
	t.Parallel()
	s := jobgen.Generate(jobgen.Config{Seed: 5, Jobs: 500, MissingRate: 1})
	require.Positive(t, s.Faults.Missing)
	maxSeen := map[string]int64{}
	for _, r := range s.Records {
		ev, err := event.Decode(r.Key, r.Value)
		require.NoError(t, err)
		maxSeen[ev.JobID] = max(maxSeen[ev.JobID], ev.Version)
	}
	for id, tr := range s.Truth {
		require.Equal(t, tr.Version, maxSeen[id], "%s: the final version is produced, so a missing delta shows as a gap", id)
	}
}

func TestAuthorityServesTheTruth(t *testing.T) {
	t.Parallel()
	s := jobgen.Generate(jobgen.Config{Seed: 1, Jobs: 3})
	srv := httptest.NewServer(jobgen.NewAuthority(s.Truth))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/jobs/job-00001")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var raw json.RawMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
	ev, err := event.DecodeValue(raw)
	require.NoError(t, err)
	require.Equal(t, event.Snapshot, ev.Kind)
	require.Equal(t, s.Truth["job-00001"].Version, ev.Version)

	// Deleted jobs: a delete record or 410 Gone with the version, and
	// either decodes as a delete at the truth's version.
	del := jobgen.Generate(jobgen.Config{Seed: 1, Jobs: 200, DeleteRate: 1})
	delSrv := httptest.NewServer(jobgen.NewAuthority(del.Truth))
	defer delSrv.Close()
	statuses := map[int]bool{}
	for id, tr := range del.Truth {
		if !tr.Deleted {
			continue
		}
		r, err := http.Get(delSrv.URL + "/jobs/" + id)
		require.NoError(t, err)
		var body map[string]any
		require.NoError(t, json.NewDecoder(r.Body).Decode(&body))
		r.Body.Close()
		statuses[r.StatusCode] = true
		require.EqualValues(t, tr.Version, body["version"], id)
		if r.StatusCode == http.StatusOK {
			require.Equal(t, "delete", body["kind"], id)
		}
	}
	require.Equal(t, map[int]bool{http.StatusOK: true, http.StatusGone: true}, statuses, "both ways of answering a deleted job")

	resp2, err := http.Get(srv.URL + "/jobs/nope")
	require.NoError(t, err)
	resp2.Body.Close()
	require.Equal(t, http.StatusNotFound, resp2.StatusCode)
}

// gaps lists, for every two consecutive records of one job in a
// partition's log, how many records of the partition lie between them.
func gaps(s *jobgen.Stream) []int {
	var out []int
	last := map[string]int{}
	at := map[int]int{}
	for _, r := range s.Records {
		pos := at[r.Partition]
		at[r.Partition]++
		k := fmt.Sprintf("%d/%s", r.Partition, r.Key)
		if prev, ok := last[k]; ok {
			out = append(out, pos-prev-1)
		}
		last[k] = pos
	}
	slices.Sort(out)
	return out
}

// TestSpreadShapeSpreadsEachJob: in the spread shape consecutive events
// of a job lie about as far apart as the partition has jobs, where the
// clustered shape keeps them a few dozen records apart; a batch of the
// spread shape meets several times as many jobs; and a seed always
// yields the same stream.
func TestSpreadShapeSpreadsEachJob(t *testing.T) {
	t.Parallel()
	cfg := jobgen.Config{Seed: 4, Jobs: 900, EventsPerJob: 20, Partitions: 3, LateRate: 0.1, DuplicateRate: 0.1}
	clustered := jobgen.Generate(cfg)
	cfg.Shape = jobgen.ShapeSpread
	spread := jobgen.Generate(cfg)
	require.Equal(t, spread.Records, jobgen.Generate(cfg).Records, "the same seed, the same stream")
	require.Equal(t, len(clustered.Records), len(spread.Records), "the same events, placed elsewhere")

	c, s := gaps(clustered), gaps(spread)
	perPartition := cfg.Jobs / cfg.Partitions // about 300
	t.Logf("gaps between a job's events: clustered median %d max %d; spread min %d median %d", c[len(c)/2], c[len(c)-1], s[0], s[len(s)/2])
	require.Less(t, c[len(c)/2], 64, "clustered: a job's events are close")
	require.Greater(t, s[len(s)/2], perPartition/2, "spread: a job's events are about a partition's jobs apart")
	require.Greater(t, s[len(s)/20], perPartition/4, "spread: nineteen gaps in twenty are wide")

	dc, ds := clustered.DistinctJobsPerBatch(0, 500), spread.DistinctJobsPerBatch(0, 500)
	t.Logf("distinct jobs in a batch of 500: clustered %.1f, spread %.1f", dc, ds)
	require.Greater(t, ds, 2*dc)
	require.LessOrEqual(t, ds, 500.0)
}

// TestLeanReferenceIsTheTruth: the lean reference has each job's version
// and deletion, and a hash of its state that PostgreSQL computes alike
// from the state stored as jsonb.
func TestLeanReferenceIsTheTruth(t *testing.T) {
	t.Parallel()
	cfg := jobgen.Config{Seed: 7, Jobs: 400, Shape: jobgen.ShapeSpread, DeleteRate: 0.2, StateBytes: 300, DuplicateRate: 0.1}
	full := jobgen.Generate(cfg)
	cfg.LeanReference = true
	lean := jobgen.Generate(cfg)
	require.Nil(t, lean.Truth)
	require.Len(t, lean.Refs, 400)
	require.Equal(t, full.Records, lean.Records)

	pool := pgtest.Pool(t)
	var states []string
	var hashes []int64
	for i, ref := range lean.Refs {
		tr := full.Truth[jobgen.JobID(i)]
		require.Equal(t, tr.Version, int64(ref.Version))
		require.Equal(t, tr.Deleted, ref.Deleted)
		if !tr.Deleted {
			states, hashes = append(states, string(tr.State)), append(hashes, ref.Hash)
		}
	}
	// Strings PostgreSQL escapes its own way, and keys it orders by length.
	for _, odd := range []string{`{"a":"quote \" back \\ tab \t nl \n ctl \u0001 \u001f é € /"}`, `{"bbb":1,"a":{"cc":[1,"x",true,null,{}],"b":-3},"dd":false}`, `{}`} {
		h, err := jobgen.StateHash([]byte(odd))
		require.NoError(t, err)
		states, hashes = append(states, odd), append(hashes, h)
	}
	var wrong int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM unnest($1::text[], $2::bigint[]) AS t(state, hash)
		WHERE ('x' || left(md5(state::jsonb::text), 16))::bit(64)::bigint <> hash`, states, hashes).Scan(&wrong))
	require.Zero(t, wrong, "every state hashes alike in Go and in PostgreSQL")

	other, err := jobgen.StateHash([]byte(`{"a":"quote \" back"}`))
	require.NoError(t, err)
	require.NotEqual(t, hashes[len(hashes)-3], other, "a different state, a different hash")
}

// TestReaderMakesTheStreamInAnyChunks: a planned stream read in chunks of
// any size is the stream Generate collects, record for record, with the
// same reference, and partition 0's batches counted chunk by chunk are
// those of the whole stream.
func TestReaderMakesTheStreamInAnyChunks(t *testing.T) {
	t.Parallel()
	for _, shape := range jobgen.Shapes {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			cfg := jobgen.Config{Seed: 21, Jobs: 400, Shape: shape, DuplicateRate: 0.2, LateRate: 0.2, MissingRate: 0.1, MisrouteRate: 0.1, BadRate: 0.1, DeleteRate: 0.1}
			whole := jobgen.Generate(cfg)
			require.Len(t, whole.Records, whole.Len)
			cfg.LeanReference = true
			for _, size := range []int{1, 37, 1 << 20} {
				s := jobgen.Plan(cfg)
				require.Nil(t, s.Records)
				require.Equal(t, whole.Len, s.Len)
				require.Equal(t, whole.Faults, s.Faults)
				require.Equal(t, whole.Events, s.Events)
				require.Equal(t, whole.StateBytes, s.StateBytes)
				rd := s.Reader()
				b := jobgen.NewBatches(0, 300)
				var got []jobgen.Record
				for {
					recs := rd.Next(size)
					if len(recs) == 0 {
						break
					}
					if len(got)+size < whole.Len {
						require.Len(t, recs, size, "a chunk is short only at the end")
					}
					b.Add(recs)
					got = append(got, recs...)
				}
				require.Equal(t, whole.Records, got, "chunks of %d", size)
				require.Empty(t, rd.Next(size), "nothing after the end")
				require.Equal(t, whole.DistinctJobsPerBatch(0, 300), b.Mean())
				for i, ref := range s.Refs {
					tr := whole.Truth[jobgen.JobID(i)]
					require.Equal(t, tr.Version, int64(ref.Version))
					require.Equal(t, tr.Deleted, ref.Deleted)
				}
			}
		})
	}
}
