-- name: OutboxInsertMany :exec
-- One statement for any number of events: the arrays are zipped row by row.
INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
SELECT
    unnest(@ids::uuid[]),
    unnest(@aggregate_types::text[]),
    unnest(@aggregate_ids::text[]),
    unnest(@event_types::text[]),
    unnest(@payloads::bytea[]),
    unnest(@headers::jsonb[]);

-- name: OutboxExists :one
-- Whether the migrations created the outbox table.
SELECT (to_regclass('outbox') IS NOT NULL)::bool AS exists;

-- name: OutboxPruneCandidates :one
-- At most max_rows ids of the oldest rows created before the cutoff, and
-- the WAL insert position read after this statement took its snapshot.
-- Every transaction whose rows the snapshot sees wrote its commit record
-- below that position, so once the slot confirms it, the relay has
-- published every one of these rows.
SELECT
    pg_current_wal_insert_lsn()::text AS wal_lsn,
    array(
        SELECT id FROM outbox
        WHERE created_at < @before::timestamptz
        ORDER BY created_at
        LIMIT @max_rows::int
    )::uuid[] AS ids;

-- name: OutboxDeleteByIDs :execrows
-- Deletes are not published (the publication carries inserts only).
DELETE FROM outbox WHERE id = ANY(@ids::uuid[]);

-- name: OutboxCreatedBefore :one
-- Whether any row older than the cutoff is left: if none is, retention may
-- have deleted rows from a window that must be republished.
SELECT EXISTS (SELECT 1 FROM outbox WHERE created_at < @before::timestamptz) AS found;

-- name: OutboxWindowByXid :many
-- The ids of the rows created at or after the start, in the order their
-- transactions got their ids (age is stable within a transaction), then by
-- id within one transaction. An aggregate's transactions that lock it
-- before writing get their ids in lock order, which is their commit order.
SELECT id
FROM outbox
WHERE created_at >= @since::timestamptz
ORDER BY age(xmin) DESC, id;

-- name: OutboxWindowByCommitTime :many
-- The same ids in commit order, exact, when track_commit_timestamp is on.
SELECT id
FROM outbox
WHERE created_at >= @since::timestamptz
ORDER BY pg_xact_commit_timestamp(xmin) NULLS FIRST, id;

-- name: OutboxGetByIDs :many
-- The rows with these ids, in no particular order.
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at
FROM outbox
WHERE id = ANY(@ids::uuid[]);
