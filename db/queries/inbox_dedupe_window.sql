-- name: InboxCopyMaxDelays :many
-- The largest delay, per consumer, between two copies of one message of a
-- live migration: the shortest inbox retention that would still have
-- deduplicated them. Two sources: the copies on the old and the new
-- channel (Ferry's relay stamps both), and a copy that arrived after the
-- message was applied from the other channel (a bridged copy, whose
-- original on the old channel carries no stamp and so has no copy row; the
-- inbox row's processed_at dates that original). A delay counts when its
-- later copy arrived at or after @since, so a long one is seen as soon as
-- it ends; a message with one copy only has no delay yet.
WITH delays AS (
    SELECT later.consumer, later.received_at - earlier.received_at AS delay
    FROM ferry_inbox_copy later
    JOIN ferry_inbox_copy earlier
      ON earlier.consumer = later.consumer
     AND earlier.message_id = later.message_id
     AND earlier.side <> later.side
     AND earlier.received_at <= later.received_at
    WHERE later.received_at >= @since::timestamptz
    UNION ALL
    SELECT c.consumer, c.received_at - i.processed_at
    FROM ferry_inbox_copy c
    JOIN inbox i ON i.consumer = c.consumer AND i.message_id = c.message_id
    WHERE c.received_at >= @since::timestamptz AND i.processed_at < c.received_at
)
SELECT consumer, (extract(epoch FROM max(delay)) * 1000000)::bigint AS delay_micros
FROM delays
GROUP BY consumer
ORDER BY consumer;

-- name: InboxDeleteBeforeExcept :execrows
-- Deletes at most max_rows of the oldest rows processed before the cutoff,
-- keeping every row of the consumers in @keep: those whose retention is
-- shorter than their live migration's dedupe window.
DELETE FROM inbox
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM inbox
    WHERE processed_at < @before::timestamptz
      AND consumer <> ALL(@keep::text[])
    ORDER BY processed_at
    LIMIT @max_rows::int
);
