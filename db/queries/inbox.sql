-- name: InboxInsert :execrows
-- Returns 0 when the consumer already processed the message.
INSERT INTO inbox (consumer, message_id, processed_at)
VALUES (@consumer, @message_id, coalesce(sqlc.narg('now')::timestamptz, now()))
ON CONFLICT (consumer, message_id) DO NOTHING;

-- name: InboxExists :one
SELECT EXISTS (
    SELECT 1 FROM inbox WHERE consumer = @consumer AND message_id = @message_id
);

-- name: InboxInsertMany :many
-- Claims a batch of messages in one statement and returns the ids that were
-- new. An id already present, or repeated in the batch, is returned at most
-- once.
INSERT INTO inbox (consumer, message_id, processed_at)
SELECT @consumer::text, unnest(@message_ids::text[]), coalesce(sqlc.narg('now')::timestamptz, now())
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id;

-- name: InboxDeleteMany :execrows
-- Releases claims made by InboxInsertMany in the same transaction for
-- messages whose handler failed, so that they can be applied later.
DELETE FROM inbox
WHERE consumer = @consumer AND message_id = ANY(@message_ids::text[]);

-- name: InboxCountByConsumer :one
-- How many message ids a consumer remembers.
SELECT count(*) FROM inbox WHERE consumer = @consumer;

-- name: InboxNewestByConsumer :one
-- When the consumer applied its newest remembered message; no row if none.
SELECT processed_at FROM inbox
WHERE consumer = @consumer
ORDER BY processed_at DESC
LIMIT 1;

-- name: InboxClaimLock :one
-- The first half of a claim in a partitioned inbox, whose primary key
-- holds processed_at (PostgreSQL has no index across partitions), so that
-- ON CONFLICT cannot see a message applied on another day. It takes a lock
-- per (consumer, message id), held to the end of the transaction, in the
-- order of the keys: a second claim of a message waits here until the
-- first commits or rolls back, exactly as an insert waits on a unique
-- index. The key space (@lock_class, hash) is Ferry's own; a hash
-- collision only makes two claims take turns. Returns the isolation level:
-- InboxClaimMany must see what committed while this waited, which only
-- READ COMMITTED, where each statement takes a new snapshot, does.
SELECT current_setting('transaction_isolation')::text AS isolation, count(l.locked)::int AS locked
FROM (
    SELECT pg_advisory_xact_lock(@lock_class::int, k.key)::text AS locked
    FROM (
        SELECT DISTINCT hashtext(@consumer::text || chr(31) || m) AS key
        FROM unnest(@message_ids::text[]) m
        ORDER BY 1
    ) k
) l;

-- name: InboxLockShared :exec
-- Takes the advisory locks of a transaction's shared resources
-- (HandleOpts.Locks: the rows its handlers lock beyond their own), held to
-- the end of the transaction, before any handler runs and in one order for
-- every transaction: that of the keys' hashes. Two transactions that lock
-- the same resources this way wait for each other in turn, never in a
-- cycle. The key space (@lock_class, hash) is Ferry's own; a hash collision
-- only makes two transactions take turns.
SELECT count(l.locked)::int AS locked
FROM (
    SELECT pg_advisory_xact_lock(@lock_class::int, k.key)::text AS locked
    FROM (
        SELECT DISTINCT hashtext(r) AS key
        FROM unnest(@resources::text[]) r
        ORDER BY 1
    ) k
) l;

-- name: InboxClaimMany :many
-- The second half of a claim in a partitioned inbox, in a statement after
-- InboxClaimLock: inserts the ids no partition holds yet and returns them,
-- each at most once.
INSERT INTO inbox (consumer, message_id, processed_at)
SELECT DISTINCT @consumer::text, m, coalesce(sqlc.narg('now')::timestamptz, now())
FROM unnest(@message_ids::text[]) m
WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = @consumer::text AND i.message_id = m)
RETURNING message_id;
