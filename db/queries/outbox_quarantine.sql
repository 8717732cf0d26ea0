-- name: OutboxQuarantineInsert :execrows
-- A relay that restarts may quarantine the same event again: keep the first.
INSERT INTO outbox_quarantine (
    id, aggregate_type, aggregate_id, event_type, payload, headers, created_at,
    topic, reason, error, commit_lsn, quarantined_at
) VALUES (
    @id, @aggregate_type, @aggregate_id, @event_type, @payload, @headers, @created_at,
    @topic, @reason, @error, sqlc.narg('commit_lsn')::pg_lsn,
    coalesce(sqlc.narg('now')::timestamptz, now())
)
ON CONFLICT (id) DO NOTHING;

-- name: OutboxQuarantineCount :one
SELECT count(*) FROM outbox_quarantine;

-- name: OutboxQuarantineList :many
SELECT * FROM outbox_quarantine
ORDER BY quarantined_at, id
LIMIT @max_rows::int;

-- name: OutboxQuarantineRequeue :execrows
-- Moves quarantined events back into the outbox, where the relay publishes
-- them again with their original ids. The caller first deletes the original
-- outbox rows (OutboxDeleteByIDs) in the same transaction.
WITH moved AS (
    DELETE FROM outbox_quarantine
    WHERE id = ANY(@ids::uuid[])
    RETURNING id, aggregate_type, aggregate_id, event_type, payload, headers, created_at
)
INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at FROM moved;

-- name: OutboxQuarantineIDs :many
SELECT id FROM outbox_quarantine ORDER BY quarantined_at, id;
