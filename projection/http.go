package projection

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Handler serves /healthz (the process is alive), /readyz (it has joined
// the group), /status (JSON) and /metrics (Prometheus text format).
func (p *Projector) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !p.Ready() {
			http.Error(w, "not ready: not yet a member of the consumer group", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(p.Status())
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		s := p.Status()
		c := s.Counters
		for _, m := range []struct {
			name, help string
			v          int64
		}{
			{"projector_records_consumed_total", "Records read from Kafka.", c.Consumed},
			{"projector_records_applied_total", "Events that changed the read model.", c.Applied},
			{"projector_records_stale_total", "Snapshots at or below the row's version, dropped.", c.Stale},
			{"projector_records_duplicate_total", "Deltas at or below the row's version, dropped.", c.Duplicates},
			{"projector_records_conflict_total", "Same job and version with different content; the first won.", c.Conflicts},
			{"projector_records_held_total", "Deltas held by the gap detector.", c.Held},
			{"projector_records_quarantined_total", "Records that broke the wire format.", c.Quarantined},
			{"projector_batches_total", "Batch transactions committed.", c.Batches},
			{"projector_fenced_total", "Batches rejected because another owner claimed the partition.", c.Fenced},
			{"projector_gaps_closed_by_wait_total", "Gaps closed by the missing versions arriving in the log.", c.ClosedByWait},
			{"projector_gaps_closed_by_reread_total", "Gaps closed by reading the store or the log again.", c.ClosedByReread},
			{"projector_gaps_closed_by_snapshot_total", "Gaps closed by a trusted snapshot.", c.ClosedBySnapshot},
			{"projector_records_lost_before_read_total", "Records deleted from the log (retention, compaction) before they were read.", c.Lost},
		} {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", m.name, m.help, m.name, m.name, m.v)
		}
		fmt.Fprintf(w, "# HELP projector_held_jobs Jobs held behind a gap right now.\n# TYPE projector_held_jobs gauge\nprojector_held_jobs %d\n", c.HeldJobs)
		fmt.Fprintf(w, "# HELP projector_partition_lag Records between the stored position and the high watermark.\n# TYPE projector_partition_lag gauge\n")
		for _, ps := range s.Partitions {
			fmt.Fprintf(w, "projector_partition_lag{topic=%q,partition=\"%d\"} %d\n", s.Topic, ps.Partition, ps.Lag)
		}
	})
	return mux
}
