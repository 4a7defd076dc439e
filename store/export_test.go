package store

// QueryEncoded is queryEncoded, for the external tests.
var QueryEncoded = queryEncoded
