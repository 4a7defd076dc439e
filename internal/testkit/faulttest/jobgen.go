package faulttest

import "github.com/projector/projector/internal/app/jobgen"

// ReferenceOf is the reference of a generated stream: its records, and the
// authority's answer for every job (the generator's final truth), which is
// what heals a delta that never arrived.
func ReferenceOf(s *jobgen.Stream) *Reference {
	ref := NewReference()
	for _, r := range s.Records {
		ref.Add(r.Key, r.Value)
	}
	for id, t := range s.Truth {
		ref.Authority(id, t.Version, t.State, t.Deleted)
	}
	return ref
}
