// Package buildhook holds nothing itself: its subpackages are hooks that
// compile to nothing in the product binary and to test machinery under a
// build tag (failpoint: kill points, with -tags failpoints).
package buildhook
