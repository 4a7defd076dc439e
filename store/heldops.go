package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// LoadHeldOps reads the ops of the given held deltas; a key not held any
// more is absent from the result.
func (s *Store) LoadHeldOps(ctx context.Context, keys []HeldKey) (map[HeldKey]json.RawMessage, error) {
	out := make(map[HeldKey]json.RawMessage, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	ids := make([]string, len(keys))
	vers := make([]int64, len(keys))
	for i, k := range keys {
		ids[i], vers[i] = k.JobID, k.Version
	}
	rows, err := s.pool.Query(ctx, `SELECT h.job_id, h.version, h.ops::text
		FROM `+s.held+` h JOIN unnest($2::text[], $3::bigint[]) AS i(job_id, version)
			ON h.job_id = i.job_id AND h.version = i.version
		WHERE h.projection = $1`, s.projection, ids, vers)
	if err != nil {
		return nil, fmt.Errorf("store: load %d held deltas' ops: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		var k HeldKey
		var ops string
		if err := rows.Scan(&k.JobID, &k.Version, &ops); err != nil {
			return nil, fmt.Errorf("store: load held deltas' ops: %w", err)
		}
		out[k] = json.RawMessage(ops)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: load held deltas' ops: %w", err)
	}
	return out, nil
}
