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
