package wait

import "github.com/projector/projector/store"

// AllRead reports whether a check has read every job waiter w holds (and
// w holds some): from then on, a write they are not told of reaches them
// only through the poll, or the read at a wait's end.
func AllRead(w *Waiter) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wt := range w.all {
		if wt.byJob && wt.seen == store.Unseen {
			return false
		}
	}
	return len(w.all) > 0
}
