package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/projector/projector/internal/app/jobgen"
	"github.com/projector/projector/store"
	"github.com/projector/projector/wait"
)

// ownWrite plays a client that must read its own write: it publishes a new
// version of one job (a retry, say) and waits, with package wait, until
// the read model has it, instead of polling. The write joins the stream's
// truth, so the verification covers it. It returns the job, its version
// and how long after publishing the read model had it.
func ownWrite(ctx context.Context, src feed, st *store.Store, stream *jobgen.Stream, partitions int, sum *Summary) (string, int64, time.Duration, error) {
	var job string
	for _, id := range stream.JobIDs() {
		if !stream.Truth[id].Deleted {
			job = id
			break
		}
	}
	if job == "" {
		return "", 0, 0, fmt.Errorf("demo: no job to write to")
	}
	w, err := wait.New(wait.Config{Store: st})
	if err != nil {
		return "", 0, 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = w.Run(runCtx)
	}()
	defer func() { stop(); <-ran }()

	version := stream.Truth[job].Version + 1
	state := json.RawMessage(`{"status":"retrying","note":"written by the demo's client"}`)
	value, _ := json.Marshal(map[string]any{"job_id": job, "version": version, "kind": "snapshot", "state": state,
		"event_id": fmt.Sprintf("evt-%s-%d", job, version), "occurred_at": time.Now().UTC().Format(time.RFC3339Nano)})
	start := time.Now()
	if err := src.produce(ctx, []jobgen.Record{{Partition: jobgen.PartitionOf(job, partitions), Key: []byte(job), Value: value}}); err != nil {
		return "", 0, 0, fmt.Errorf("demo: own write: %w", err)
	}
	stream.Truth[job] = jobgen.Truth{Version: version, State: state}
	sum.Records++
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := w.WaitJob(waitCtx, job, version)
	if err != nil {
		return "", 0, 0, fmt.Errorf("demo: own write %s v%d: at v%d: %w", job, version, got.Version, err)
	}
	return job, version, time.Since(start), nil
}
