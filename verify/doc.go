// Package verify compares the read model with the trusted snapshot
// authority and, when asked, heals the drift it finds.
//
// It owns the drift kinds (missing, behind, ahead, differs) and the pace of
// requests to the authority. It must never lower a row's version: every
// repair goes through [store.Store.Heal], whose version condition is part of
// the write, and a row ahead of the authority is reported, never touched.
package verify
