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

-- name: OutboxDeleteBefore :execrows
-- Deletes at most max_rows of the oldest rows created before the cutoff, so
-- that retention holds short locks and leaves small transactions.
DELETE FROM outbox
WHERE id IN (
    SELECT id FROM outbox
    WHERE created_at < @before::timestamptz
    ORDER BY created_at
    LIMIT @max_rows::int
);

-- name: OutboxDeleteByIDs :execrows
-- Deletes are not published (the publication carries inserts only).
DELETE FROM outbox WHERE id = ANY(@ids::uuid[]);
