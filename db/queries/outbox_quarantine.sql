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
-- them again with their original ids, in the order they were quarantined:
-- the relay quarantines an aggregate's events in their commit order, so
-- they go back in it. The caller first deletes the original outbox rows
-- (OutboxDeleteByIDs) in the same transaction.
WITH moved AS (
    DELETE FROM outbox_quarantine
    WHERE id = ANY(@ids::uuid[])
    RETURNING id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, quarantined_at
)
INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at FROM moved
ORDER BY quarantined_at, id;

-- name: OutboxQuarantineIDs :many
SELECT id FROM outbox_quarantine ORDER BY quarantined_at, id;

-- name: OutboxQuarantineWithBehind :many
-- The events @ids name plus every event quarantined behind one of them
-- (reason @behind_reason: the same aggregate, quarantined later), in
-- quarantine order: a requeue moves an aggregate's held events together, so
-- that none goes back ahead of the events it was held behind.
SELECT b.id FROM outbox_quarantine b
WHERE b.id = ANY(@ids::uuid[])
   OR (b.reason = @behind_reason::text AND EXISTS (
        SELECT 1 FROM outbox_quarantine s
        WHERE s.id = ANY(@ids::uuid[])
          AND s.aggregate_type = b.aggregate_type AND s.aggregate_id = b.aggregate_id
          AND (s.quarantined_at, s.id) < (b.quarantined_at, b.id)))
ORDER BY b.quarantined_at, b.id;

-- name: OutboxQuarantineDiscard :many
-- Deletes quarantined events for good and returns their ids. The caller
-- deletes their original outbox rows in the same transaction, which tells
-- the relay they will not come back (OutboxQuarantineGone).
DELETE FROM outbox_quarantine WHERE id = ANY(@ids::uuid[]) RETURNING id;

-- name: OutboxQuarantineHolds :many
-- Every quarantined event's aggregate, in quarantine order: in
-- order-keeping mode (relay run --quarantine-order keep) the relay holds
-- the later events of these aggregates behind them.
SELECT aggregate_type, aggregate_id, id, commit_lsn FROM outbox_quarantine
ORDER BY quarantined_at, id;

-- name: OutboxQuarantineGone :many
-- Those of @ids that are neither quarantined nor in the outbox: discarded.
-- A requeued event is back in the outbox; a quarantined one is in both.
SELECT g.id::uuid AS id FROM unnest(@ids::uuid[]) AS g(id)
WHERE NOT EXISTS (SELECT 1 FROM outbox_quarantine q WHERE q.id = g.id)
  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = g.id);
