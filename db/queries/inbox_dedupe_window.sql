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

-- name: InboxCopyPlansRecorded :many
-- Every consumer and plan with copies recorded: a loose scan of the index
-- on (consumer, plan, received_at), one lookup per pair.
WITH RECURSIVE k AS (
    (SELECT c.consumer, c.plan FROM ferry_inbox_copy c ORDER BY c.consumer, c.plan LIMIT 1)
    UNION ALL
    SELECT n.consumer, n.plan FROM k
    CROSS JOIN LATERAL (SELECT c.consumer, c.plan FROM ferry_inbox_copy c
                        WHERE (c.consumer, c.plan) > (k.consumer, k.plan)
                        ORDER BY c.consumer, c.plan LIMIT 1) n
)
SELECT k.consumer::text AS consumer, k.plan::text AS plan FROM k;

-- name: InboxCopyPrune :one
-- Reads the next @max_rows copies of the consumer's plan received before
-- @before, after (@after_at, @after_id, @after_side) in that order, and
-- deletes every copy of the events among them that are settled: an
-- authoritative copy recorded (applied, or dead-lettered) or an inbox row,
-- and no copy received from @before on. An event with a shadow only
-- (awaiting its authoritative copy, or quarantined) is kept, and so is
-- the plan's first event, which dates the migration's start
-- (InboxCopySince). Returns what it deleted and the last copy it read.
WITH batch AS (
    SELECT c.message_id, c.side, c.received_at FROM ferry_inbox_copy c
    WHERE c.consumer = @consumer AND c.plan = @plan
      AND c.received_at >= @after_at::timestamptz AND c.received_at < @before::timestamptz
      AND (c.received_at, c.message_id, c.side) > (@after_at::timestamptz, @after_id::text, @after_side::text)
    ORDER BY c.received_at, c.message_id, c.side
    LIMIT @max_rows::int
), first AS (
    SELECT f.message_id FROM ferry_inbox_copy f WHERE f.consumer = @consumer AND f.plan = @plan
    ORDER BY f.received_at LIMIT 1
), settled AS (
    SELECT DISTINCT b.message_id FROM batch b
    WHERE b.message_id NOT IN (SELECT first.message_id FROM first)
      AND (EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = @consumer AND a.message_id = b.message_id
                   AND a.role = 'authoritative' OFFSET 0)
           OR EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = @consumer AND i.message_id = b.message_id OFFSET 0))
      AND NOT EXISTS (SELECT 1 FROM ferry_inbox_copy n WHERE n.consumer = @consumer AND n.message_id = b.message_id
                      AND n.received_at >= @before::timestamptz OFFSET 0)
), gone AS (
    DELETE FROM ferry_inbox_copy c USING settled s WHERE c.consumer = @consumer AND c.message_id = s.message_id
    RETURNING 1
), last AS (
    SELECT b.received_at, b.message_id, b.side FROM batch b
    ORDER BY b.received_at DESC, b.message_id DESC, b.side DESC LIMIT 1
)
SELECT (SELECT count(*) FROM gone)::bigint AS deleted, (SELECT count(*) FROM batch)::int AS read,
       coalesce(l.received_at, @after_at::timestamptz)::timestamptz AS last_at,
       coalesce(l.message_id, @after_id::text)::text AS last_id, coalesce(l.side, @after_side::text)::text AS last_side
FROM (SELECT 1) AS one LEFT JOIN last l ON true;
