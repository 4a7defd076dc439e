package event

import "testing"

// BenchmarkDecode decodes the two records every stream is made of; the
// allocations per record are the figure to watch (docs/performance.md).
func BenchmarkDecode(b *testing.B) {
	for name, v := range map[string]string{
		"snapshot": `{"job_id":"job-00042","version":7,"kind":"snapshot","event_id":"evt-job-00042-7","occurred_at":"2026-01-01T00:00:07.5Z","state":{"status":"running","job_type":"crawl","processed_articles":120,"created_at":"2026-01-01T00:00:00Z","progress":{"stage":"stage-6"}}}`,
		"delta":    `{"job_id":"job-00042","version":8,"kind":"delta","event_id":"evt-job-00042-8","occurred_at":"2026-01-01T00:00:08.5Z","ops":[{"op":"increment","path":"/processed_articles","by":17}]}`,
	} {
		b.Run(name, func(b *testing.B) {
			key, val := []byte("job-00042"), []byte(v)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(key, val); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
