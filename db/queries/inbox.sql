-- name: InboxInsert :execrows
-- Returns 0 when the consumer already processed the message.
INSERT INTO inbox (consumer, message_id, processed_at)
VALUES (@consumer, @message_id, coalesce(sqlc.narg('now')::timestamptz, now()))
ON CONFLICT (consumer, message_id) DO NOTHING;

-- name: InboxExists :one
SELECT EXISTS (
    SELECT 1 FROM inbox WHERE consumer = @consumer AND message_id = @message_id
);

-- name: InboxDeleteBefore :execrows
-- Deletes at most max_rows of the oldest rows processed before the cutoff.
DELETE FROM inbox
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM inbox
    WHERE processed_at < @before::timestamptz
    ORDER BY processed_at
    LIMIT @max_rows::int
);
