-- name: InboxCopyMaxDelays :many
-- The largest delay, per consumer, between the two copies of one message of
-- a live migration (one on the old channel, one on the new): the shortest
-- inbox retention that would still have deduplicated them. A pair counts
-- when its later copy arrived at or after @since, so a long delay is seen
-- as soon as it ends; a message with one copy only has no delay yet.
SELECT later.consumer,
       (extract(epoch FROM max(later.received_at - earlier.received_at)) * 1000000)::bigint AS delay_micros
FROM ferry_inbox_copy later
JOIN ferry_inbox_copy earlier
  ON earlier.consumer = later.consumer
 AND earlier.message_id = later.message_id
 AND earlier.side <> later.side
 AND earlier.received_at <= later.received_at
WHERE later.received_at >= @since::timestamptz
GROUP BY later.consumer
ORDER BY later.consumer;

-- name: InboxDeleteBeforeExcept :execrows
-- InboxDeleteBefore that keeps every row of the consumers in @keep: those
-- whose retention is shorter than their live migration's dedupe window.
DELETE FROM inbox
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM inbox
    WHERE processed_at < @before::timestamptz
      AND consumer <> ALL(@keep::text[])
    ORDER BY processed_at
    LIMIT @max_rows::int
);
