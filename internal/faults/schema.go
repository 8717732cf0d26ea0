package faults

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// schema holds the suite's own tables, next to Ferry's in the run's
// database.
//
//   - fault_versions is the producer's truth: the load generator bumps an
//     aggregate's version in the same transaction as the event, so committed
//     versions have no gaps and a rolled-back transaction leaves none.
//   - fault_state is each consumer's view of an aggregate: the version of the
//     last event applied. The handler locks the row, so the effects of one
//     aggregate apply one at a time and each one sees its predecessor.
//   - fault_effects has one row per effect, with no unique key: a double
//     effect shows up as two rows instead of failing the transaction.
//     prev_version is the state the effect found; an effect whose version
//     is not prev_version+1 was applied out of order (or after a gap).
//   - fault_foreign is the events a producer that is not Ferry's published
//     on a migration's old channel (migration_foreign.go): the checker
//     counts them with the outbox's.
const schema = `
CREATE TABLE fault_versions (
    aggregate_id text   PRIMARY KEY,
    version      bigint NOT NULL
);
CREATE TABLE fault_state (
    consumer     text   NOT NULL,
    aggregate_id text   NOT NULL,
    version      bigint NOT NULL,
    applied      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, aggregate_id)
);
CREATE TABLE fault_effects (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    aggregate_id text        NOT NULL,
    version      bigint      NOT NULL,
    prev_version bigint,
    worker       text        NOT NULL,
    partition    int         NOT NULL,
    kafka_offset bigint      NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE fault_foreign (
    id           uuid   PRIMARY KEY,
    aggregate_id text   NOT NULL,
    version      bigint NOT NULL
);
`

// createSchema creates the suite's tables in a migrated database and seeds
// the version of every aggregate, for the producer and for each consumer.
func createSchema(ctx context.Context, pool *pgxpool.Pool, aggregates, foreign int, consumers []string) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create the suite's tables: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO fault_versions (aggregate_id, version)
		SELECT 'agg-' || lpad(i::text, 4, '0'), 0 FROM generate_series(0, $1 - 1) i
		UNION ALL SELECT 'frn-' || lpad(i::text, 3, '0'), 0 FROM generate_series(0, $2 - 1) i`, aggregates, foreign); err != nil {
		return fmt.Errorf("seed fault_versions: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO fault_state (consumer, aggregate_id, version)
		SELECT c, aggregate_id, 0 FROM fault_versions, unnest($1::text[]) c`, consumers); err != nil {
		return fmt.Errorf("seed fault_state: %w", err)
	}
	return nil
}
