// Package migration moves a running Ferry system from one Kafka channel to
// another (another cluster, or another topic layout on the same one) while
// events flow: nothing lost, nothing applied twice, no aggregate's order
// broken, and a way back until the old channel is retired.
//
// A Plan names the old and the new channel and the consumer groups that
// must follow. Its phase moves OLD_ONLY -> DUAL_WRITE -> CUTOVER ->
// OLD_RETIRED; DUAL_WRITE -> OLD_ONLY (abandon) and CUTOVER -> DUAL_WRITE
// (rollback) are the only ways back, and there is none after OLD_RETIRED.
// CUTOVER moves the aggregates to the new channel by slices: a stable hash
// of the aggregate id into 128 slices (Slices), moved k at a time.
//
// The plan and every request to change its phase live in the producer's
// PostgreSQL (ferry_migration, ferry_migration_request,
// ferry_migration_step), so a change takes effect without a redeploy.
// Every request is recorded with who, when, from and to, and whether it was
// accepted; a forbidden or premature one is rejected with its reason and
// recorded too. An accepted change is a row of ferry_migration_step, which
// the relay reads from the WAL: it applies at that exact point of the
// commit order.
//
// Not to be confused with Ferry's SQL schema and its migrations: those are
// package schema's.
package migration
