//go:build !failpoints

package failpoint

// Hit does nothing in a normal build.
func Hit(string) {}
