package main

// The references under docs/reference are generated from the code; their
// tests (reference_test.go) fail when a committed one differs.
//go:generate go test -count=1 -run ^(TestMetricReference|TestFlagReference)$ . -update
