// Package pgtest gives tests a real PostgreSQL: a throwaway cluster started from the
// machine's PostgreSQL binaries, or the server named by DATABASE_URL when it is set.
//
// A test binary calls [Main] from TestMain; each test then calls [NewSchema] for an
// isolated, freshly created schema and a pool whose search_path points at it. Schemas
// are dropped at cleanup and the cluster is stopped when the binary exits, so packages
// tested in parallel by `go test ./...` never share state.
package pgtest
