package store

// QueryEncoded is queryEncoded, for the external tests.
var QueryEncoded = queryEncoded

// DrainParamBufs empties the kept parameter buffers, so that the next
// statement starts a new one.
func DrainParamBufs() {
	for {
		select {
		case <-paramBufs:
		default:
			return
		}
	}
}

// SwapDiff, CompareForSwap, SwapPlanning and WorkersLackedMemory are
// swapDiff, compareForSwap, swapPlanning and workersLackedMemory, for the
// external tests.
var (
	SwapDiff            = swapDiff
	CompareForSwap      = compareForSwap
	SwapPlanning        = swapPlanning
	WorkersLackedMemory = workersLackedMemory
)
