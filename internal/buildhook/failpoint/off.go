//go:build !failpoints

package failpoint

// Hit does nothing in a normal build.
func Hit(string) {}

// Unfenced is false in a normal build: the fence cannot be turned off.
func Unfenced() bool { return false }
