// Package dbsqlc is the code sqlc generates from the queries in db/queries,
// with Ferry's goose migrations (db/migrations) as the schema: one method
// per query, named <Table><Verb>, each taking the caller's DBTX (a pool, a
// connection or a transaction). Run `make generate` after changing a query
// or a migration; `make verify` fails while this code is stale.
//
// This file is written by hand; the others are generated and must not be
// edited.
package dbsqlc
