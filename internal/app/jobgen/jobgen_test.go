package jobgen_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/projector/projector/delta"
	"github.com/projector/projector/event"
	"github.com/projector/projector/internal/app/jobgen"
)

// TestTruthIsTheFoldOfEveryVersion replays each job's events in version
// order from {} and checks the reference model is what it gives.
func TestTruthIsTheFoldOfEveryVersion(t *testing.T) {
	t.Parallel()
	s := jobgen.Generate(jobgen.Config{Seed: 9, Jobs: 300, DuplicateRate: 0.2, LateRate: 0.2, MisrouteRate: 0.1, BadRate: 0.1, DeleteRate: 0.2})
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
