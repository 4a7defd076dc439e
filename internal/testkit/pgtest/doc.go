// Package pgtest gives tests a real PostgreSQL: one pool per test binary,
// from DATABASE_URL or the local server, and a fresh migrated schema per
// test that is dropped at cleanup. A missing server fails the test with a
// message saying how to provide one; it never skips.
//
// It must never share tables between tests: each test gets its own schema.
package pgtest
