-- name: InboxChannelLearn :execrows
-- Remembers a channel learned from a fence; 1 when it is new.
INSERT INTO ferry_inbox_channel (consumer, plan, side, topic, peer, channel)
VALUES (@consumer, @plan, @side, @topic, @peer, @channel)
ON CONFLICT (consumer, plan, side, topic) DO NOTHING;

-- name: InboxChannels :many
SELECT * FROM ferry_inbox_channel WHERE consumer = @consumer ORDER BY learned_at, plan, side, topic;

-- name: InboxFencePassed :exec
-- Records a fence passed on a partition; never moves back.
INSERT INTO ferry_inbox_fence (consumer, plan, side, topic, partition, epoch, partitions)
VALUES (@consumer, @plan, @side, @topic, @partition, @epoch, @partitions)
ON CONFLICT (consumer, plan, side, topic, partition) DO UPDATE
SET epoch = excluded.epoch, partitions = excluded.partitions, passed_at = now()
WHERE ferry_inbox_fence.epoch < excluded.epoch;

-- name: InboxFencesAtLeast :one
-- How many partitions of a topic passed a fence of epoch or later, and how
-- many partitions the topic has (0 when no fence was passed yet).
SELECT count(*) FILTER (WHERE epoch >= @epoch::int)::int AS passed, coalesce(max(partitions), 0)::int AS partitions
FROM ferry_inbox_fence
WHERE consumer = @consumer AND plan = @plan AND side = @side AND topic = @topic;

-- name: InboxCopyInsert :exec
-- A shadow copy keeps its record (topic to headers), to stand in for a lost
-- authoritative copy; an authoritative one passes NULLs, and alone when the
-- relay wrote it to one channel only (route.Stamp.Alone).
INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at, alone,
    topic, partition, record_offset, record_key, record_value, record_headers)
VALUES (@consumer, @message_id, @plan, @side, @role, @epoch, @digest, @received_at, @alone,
    sqlc.narg('topic'), sqlc.narg('partition'), sqlc.narg('record_offset'), sqlc.narg('record_key'),
    sqlc.narg('record_value'), sqlc.narg('record_headers'))
ON CONFLICT (consumer, message_id, side) DO NOTHING;

-- name: InboxCopyClaim :execrows
-- InboxInsert of an authoritative copy together with its ferry_inbox_copy
-- row, in one statement (one round trip for a message per transaction):
-- the number of inbox rows it inserted, 0 when the consumer already
-- processed the message. The copy row is written either way.
WITH copy AS (
    INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at, alone)
    VALUES (@consumer, @message_id, @plan, @side, 'authoritative', @epoch, @digest, @received_at, @alone)
    ON CONFLICT (consumer, message_id, side) DO NOTHING
)
INSERT INTO inbox (consumer, message_id, processed_at)
VALUES (@consumer, @message_id, now())
ON CONFLICT (consumer, message_id) DO NOTHING;

-- name: InboxAuthoritativeCopyInsertMany :exec
-- Records the authoritative copies of a batch in one statement.
INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at, alone)
SELECT @consumer, unnest(@message_ids::text[]), unnest(@plans::text[]), unnest(@sides::text[]),
       'authoritative', unnest(@epochs::int[]), unnest(@digests::bytea[]), unnest(@received_ats::timestamptz[]),
       unnest(@alones::boolean[])
ON CONFLICT (consumer, message_id, side) DO NOTHING;

-- name: InboxAuthoritativeCopyInsertManyNew :exec
-- InboxAuthoritativeCopyInsertMany for copies none of which is recorded
-- yet (see InboxShadowInsertManyNew): a unique_violation when one is.
INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at, alone)
SELECT @consumer, unnest(@message_ids::text[]), unnest(@plans::text[]), unnest(@sides::text[]),
       'authoritative', unnest(@epochs::int[]), unnest(@digests::bytea[]), unnest(@received_ats::timestamptz[]),
       unnest(@alones::boolean[]);

-- name: InboxShadowInsertMany :exec
-- Records many shadow copies in one statement (the worker's shadow writer).
INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at,
    topic, partition, record_offset, record_key, record_value, record_headers)
SELECT unnest(@consumers::text[]), unnest(@message_ids::text[]), unnest(@plans::text[]), unnest(@sides::text[]),
       'shadow', unnest(@epochs::int[]), unnest(@digests::bytea[]), unnest(@received_ats::timestamptz[]),
       unnest(@topics::text[]), unnest(@partitions::int[]), unnest(@record_offsets::bigint[]),
       unnest(@record_keys::bytea[]), unnest(@record_values::bytea[]), unnest(@record_headers::jsonb[])
ON CONFLICT (consumer, message_id, side) DO NOTHING;

-- name: InboxShadowInsertManyNew :exec
-- InboxShadowInsertMany for copies none of which is recorded yet, as
-- almost every batch's are: without ON CONFLICT, whose speculative
-- insertion costs each row a second look into the primary key and a WAL
-- record of its own. A copy recorded already fails the statement
-- (unique_violation), and the writer records the batch with
-- InboxShadowInsertMany instead.
INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at,
    topic, partition, record_offset, record_key, record_value, record_headers)
SELECT unnest(@consumers::text[]), unnest(@message_ids::text[]), unnest(@plans::text[]), unnest(@sides::text[]),
       'shadow', unnest(@epochs::int[]), unnest(@digests::bytea[]), unnest(@received_ats::timestamptz[]),
       unnest(@topics::text[]), unnest(@partitions::int[]), unnest(@record_offsets::bigint[]),
       unnest(@record_keys::bytea[]), unnest(@record_values::bytea[]), unnest(@record_headers::jsonb[]);

-- name: InboxCopySince :one
-- When a consumer received its first copy of a plan: the migration began
-- there (now, before its first copy).
SELECT coalesce(min(received_at), now())::timestamptz AS since FROM ferry_inbox_copy WHERE consumer = @consumer AND plan = @plan;

-- name: InboxNotApplied :one
-- How many of @ids the consumer's inbox does not hold.
SELECT count(*)::bigint FROM unnest(@ids::text[]) AS m(id)
WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = @consumer AND i.message_id = m.id);

-- name: InboxCopyPlans :many
-- The plans a consumer follows (it learned a channel of them).
SELECT DISTINCT plan FROM ferry_inbox_channel WHERE consumer = @consumer ORDER BY plan;

-- name: InboxCopyReport :one
-- The definition of a shadow report, which the worker keeps up to date
-- from the copies recorded since its last one instead of reading its
-- window whole (inbox/migration_window.go, held to this query by
-- TestTheKeptReportCountsWhatTheQueryCounts):
-- A consumer's shadow report of a plan (migration.Report) at report_at, on
-- the events of which a copy arrived in the @window_seconds before it (what
-- holds now, not a stall long past), each with both its copies wherever
-- they arrived: an event counts while either copy is in the window, so a
-- shadow that came first is still there when its authoritative copy comes.
-- It counts the copies of each role received in the window, the events with
-- both copies, those whose payloads differ, the authoritative copies in the
-- window older than the allowed lateness without a shadow (but those the
-- relay wrote to one channel only: alone), and the delay
-- between an event's two copies (p99 and max, seconds), and the
-- authoritative copies of each side in the window that arrived after their
-- event was applied (duplicates the inbox blocked: a bridged copy, a copy
-- brought again after a rollback). For the rejection to say when the gate
-- would pass if nothing else were late: for each of @late_bounds (seconds),
-- when the newest event whose copies are further apart than it completed
-- (late_over and late_newest, epoch seconds, for the bounds some event
-- exceeds), and when the newest authoritative copy counted missing came.
WITH recent AS (
    SELECT DISTINCT c.message_id FROM ferry_inbox_copy c
    WHERE c.consumer = @consumer AND c.plan = @plan
      AND c.received_at > sqlc.arg(report_at)::timestamptz - make_interval(secs => @window_seconds::float8)
      AND c.received_at <= sqlc.arg(report_at)::timestamptz
), copies AS (
    -- Each authoritative copy of those events, with the event's shadow and
    -- inbox row: looked up by id (the primary key), so that the plan stays
    -- linear even before the table has statistics.
    SELECT a.side, a.received_at AS a_at, a.alone, s.received_at AS s_at, a.digest <> s.digest AS mismatch,
           abs(extract(epoch FROM s.received_at - a.received_at))::float8 AS lateness,
           greatest(a.received_at, s.received_at) AS completed, i.processed_at,
           a.received_at > sqlc.arg(report_at)::timestamptz - make_interval(secs => @window_seconds::float8) AS in_window,
           NOT a.alone AND a.received_at < sqlc.arg(report_at)::timestamptz - make_interval(secs => @allowed_seconds::float8) AS aged
    FROM recent r
    JOIN ferry_inbox_copy a ON a.consumer = @consumer AND a.message_id = r.message_id AND a.role = 'authoritative'
    LEFT JOIN ferry_inbox_copy s ON s.consumer = @consumer AND s.message_id = r.message_id AND s.role = 'shadow'
        AND s.received_at <= sqlc.arg(report_at)::timestamptz
    LEFT JOIN inbox i ON i.consumer = @consumer AND i.message_id = r.message_id
    WHERE a.received_at <= sqlc.arg(report_at)::timestamptz
), marks AS (
    SELECT u.bound, (SELECT max(c.completed) FROM copies c WHERE c.lateness > u.bound) AS newest
    FROM unnest(@late_bounds::float8[]) AS u(bound)
)
SELECT
    count(*) FILTER (WHERE c.in_window)::bigint AS authoritative,
    (SELECT count(*) FROM ferry_inbox_copy sc WHERE sc.consumer = @consumer AND sc.plan = @plan AND sc.role = 'shadow'
        AND sc.received_at > sqlc.arg(report_at)::timestamptz - make_interval(secs => @window_seconds::float8)
        AND sc.received_at <= sqlc.arg(report_at)::timestamptz)::bigint AS shadow,
    count(c.s_at)::bigint AS checked,
    count(*) FILTER (WHERE c.mismatch)::bigint AS mismatched,
    count(*) FILTER (WHERE c.in_window AND c.aged AND c.s_at IS NULL)::bigint AS missing,
    count(*) FILTER (WHERE c.in_window AND c.aged)::bigint AS aged,
    coalesce(extract(epoch FROM max(c.a_at) FILTER (WHERE c.in_window AND c.aged AND c.s_at IS NULL)), 0)::float8 AS missing_newest,
    (SELECT coalesce(array_agg(m.bound ORDER BY m.bound), '{}') FROM marks m WHERE m.newest IS NOT NULL)::float8[] AS late_over,
    (SELECT coalesce(array_agg(extract(epoch FROM m.newest) ORDER BY m.bound), '{}') FROM marks m
        WHERE m.newest IS NOT NULL)::float8[] AS late_newest,
    coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY c.lateness), 0)::float8 AS p99_seconds,
    coalesce(max(c.lateness), 0)::float8 AS max_seconds,
    count(*) FILTER (WHERE c.in_window AND c.side = 'old' AND c.processed_at < c.a_at)::bigint AS duplicates_old,
    count(*) FILTER (WHERE c.in_window AND c.side = 'new' AND c.processed_at < c.a_at)::bigint AS duplicates_new
FROM copies c;

-- name: InboxFenceFloor :one
-- The newest epoch whose fences the consumer passed on every partition of
-- every topic of the plan's old channel it knows (0: none, or a topic with a
-- partition that passed none).
SELECT coalesce(min(CASE WHEN t.n = t.partitions THEN t.floor ELSE 0 END), 0)::int AS epoch
FROM (
    SELECT f.topic, count(*) AS n, max(f.partitions) AS partitions, min(f.epoch) AS floor
    FROM ferry_inbox_fence f
    WHERE f.consumer = @consumer AND f.plan = @plan AND f.side = 'old'
    GROUP BY f.topic
) t;

-- name: InboxQuarantineResolved :execrows
-- Drops the quarantined events whose authoritative copy was applied, or
-- dead-lettered (its ferry_inbox_copy row), since.
DELETE FROM ferry_inbox_quarantine q
WHERE q.consumer = @consumer
  AND (EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = q.consumer AND i.message_id = q.message_id)
       OR EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = q.consumer AND a.message_id = q.message_id
                  AND a.role = 'authoritative'));

-- name: InboxCopyHorizon :one
-- Where a read of the copies recorded from now on starts: every copy
-- recorded by a transaction from xmax on, or by one of those still running
-- (inflight), is visible to a statement after this one once its
-- transaction commits; any other copy already is.
SELECT pg_snapshot_xmax(s) AS xmax, array(SELECT pg_snapshot_xip(s))::xid8[] AS inflight
FROM pg_current_snapshot() AS s;

-- name: InboxCopiesSince :many
-- The consumer's copies recorded by transactions from @since on or of
-- @inflight (InboxCopyHorizon), each half read through the index on
-- (consumer, xact); an authoritative copy with when its event was applied
-- (µs since the epoch; 0: not applied).
WITH c AS (
    SELECT * FROM ferry_inbox_copy n WHERE n.consumer = @consumer AND n.xact >= @since::xid8
    UNION ALL
    SELECT * FROM ferry_inbox_copy n
    WHERE cardinality(@inflight::xid8[]) > 0
      AND n.consumer = @consumer AND n.xact = ANY(@inflight::xid8[]) AND n.xact < @since::xid8
)
SELECT c.message_id, c.plan, c.side, c.role, c.received_at, c.digest, c.alone,
       (CASE WHEN c.role = 'authoritative'
             THEN coalesce((SELECT (extract(epoch FROM i.processed_at) * 1000000)::bigint FROM inbox i
                            WHERE i.consumer = @consumer AND i.message_id = c.message_id), 0)
             ELSE 0 END)::bigint AS processed_micros
FROM c;

-- name: InboxCopyEventsOf :many
-- Every copy of the consumer's events @ids, as InboxCopiesSince returns
-- them, each event's looked up by id (OFFSET 0 keeps the planner from
-- joining the whole table instead).
SELECT c.message_id, c.plan, c.side, c.role, c.received_at, c.digest, c.alone,
       (CASE WHEN c.role = 'authoritative'
             THEN coalesce((SELECT (extract(epoch FROM i.processed_at) * 1000000)::bigint FROM inbox i
                            WHERE i.consumer = @consumer AND i.message_id = c.message_id), 0)
             ELSE 0 END)::bigint AS processed_micros
FROM unnest(@ids::text[]) AS u(message_id)
CROSS JOIN LATERAL (SELECT * FROM ferry_inbox_copy c WHERE c.consumer = @consumer AND c.message_id = u.message_id
                    OFFSET 0) c;

-- name: InboxCopyEventsReceivedAfter :many
-- Every copy of the consumer's events of @plans of which a copy was
-- received after @after, with when the event was applied (µs since the
-- epoch; 0: not applied), each event's looked up by id.
SELECT c.message_id, c.plan, c.side, c.role, c.received_at, c.digest, c.alone, m.processed_micros
FROM (SELECT u.message_id,
             coalesce((SELECT (extract(epoch FROM i.processed_at) * 1000000)::bigint FROM inbox i
                       WHERE i.consumer = @consumer AND i.message_id = u.message_id), 0)::bigint AS processed_micros
      FROM (SELECT DISTINCT n.message_id FROM ferry_inbox_copy n
            WHERE n.consumer = @consumer AND n.plan = ANY(@plans::text[]) AND n.received_at > @after::timestamptz) u
      OFFSET 0) m
CROSS JOIN LATERAL (SELECT * FROM ferry_inbox_copy c WHERE c.consumer = @consumer AND c.message_id = m.message_id
                    OFFSET 0) c;

-- name: InboxProcessedAt :many
-- When the consumer applied those of @ids it applied.
SELECT message_id, processed_at FROM inbox WHERE consumer = @consumer AND message_id = ANY(@ids::text[]);

-- name: InboxShadowsUnlocated :many
-- The consumer's shadow copies recorded by transactions from @since on or
-- of @inflight (InboxCopyHorizon) of events neither applied nor accounted
-- for (an authoritative copy row: applied, or dead-lettered), with a
-- record, whose authoritative copy's partition is not known yet, in the
-- order of their transactions; late when received more than
-- @late_seconds ago. Each half reads the index on (consumer, xact), and
-- each shadow is looked up in the inbox and the authoritative copies by
-- its key (OFFSET 0: a few shadows of a table just analyzed, and the
-- planner hashed the whole tables instead).
WITH c AS (
    SELECT * FROM ferry_inbox_copy n WHERE n.consumer = @consumer AND n.xact >= @since::xid8
    UNION ALL
    SELECT * FROM ferry_inbox_copy n
    WHERE cardinality(@inflight::xid8[]) > 0
      AND n.consumer = @consumer AND n.xact = ANY(@inflight::xid8[]) AND n.xact < @since::xid8
)
SELECT c.message_id, c.plan, c.side, c.topic::text AS topic, c.record_key, c.xact, c.received_at,
       (c.received_at < now() - make_interval(secs => @late_seconds::float8))::boolean AS late
FROM c
WHERE c.role = 'shadow' AND c.topic IS NOT NULL AND c.auth_partition IS NULL
  AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = c.consumer AND i.message_id = c.message_id OFFSET 0)
  AND NOT EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = c.consumer AND a.message_id = c.message_id
                  AND a.role = 'authoritative' OFFSET 0)
ORDER BY c.xact
LIMIT @max_rows;

-- name: InboxShadowsAwaiting :many
-- InboxShadowsUnlocated of the consumer's shadows @message_ids (of
-- @sides): those still neither applied, accounted for nor located, each
-- looked up by its key (OFFSET 0 keeps the planner from hashing the whole
-- tables instead).
WITH u AS (
    SELECT unnest(@message_ids::text[]) AS message_id, unnest(@sides::text[]) AS side
)
SELECT c.message_id, c.plan, c.side, c.topic::text AS topic, c.record_key, c.xact, c.received_at,
       (c.received_at < now() - make_interval(secs => @late_seconds::float8))::boolean AS late
FROM u
CROSS JOIN LATERAL (
    SELECT * FROM ferry_inbox_copy c
    WHERE c.consumer = @consumer AND c.message_id = u.message_id AND c.side = u.side
      AND c.role = 'shadow' AND c.topic IS NOT NULL AND c.auth_partition IS NULL
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = c.consumer AND i.message_id = c.message_id)
      AND NOT EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = c.consumer AND a.message_id = c.message_id
                      AND a.role = 'authoritative')
    OFFSET 0) c;

-- name: InboxShadowsSettled :execrows
-- Forgets where the located shadows' authoritative copies are once their
-- event is applied or accounted for: the located shadows are those
-- awaited.
UPDATE ferry_inbox_copy c SET auth_topic = NULL, auth_partition = NULL
WHERE c.consumer = @consumer AND c.role = 'shadow' AND c.topic IS NOT NULL AND c.auth_partition IS NOT NULL
  AND (EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = c.consumer AND i.message_id = c.message_id)
       OR EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = c.consumer AND a.message_id = c.message_id
                  AND a.role = 'authoritative'));

-- name: InboxShadowsLocate :exec
-- Records where shadow copies' authoritative copies were written.
WITH u AS (
    SELECT unnest(@message_ids::text[]) AS message_id, unnest(@sides::text[]) AS side,
           unnest(@topics::text[]) AS topic, unnest(@partitions::int[]) AS partition
)
UPDATE ferry_inbox_copy c SET auth_topic = u.topic, auth_partition = u.partition
FROM u
WHERE c.consumer = @consumer AND c.message_id = u.message_id AND c.side = u.side;

-- name: InboxChannelRoutes :many
-- For each topic of an old channel a consumer learned a new channel from:
-- the topic there, and each topic's partition count as the fences the
-- consumer passed say (0: none passed yet), and the new channel.
SELECT ch.plan, ch.topic AS old_topic, ch.peer AS new_topic, ch.channel AS new_channel,
    coalesce((SELECT max(f.partitions) FROM ferry_inbox_fence f WHERE f.consumer = ch.consumer AND f.plan = ch.plan
              AND f.side = 'old' AND f.topic = ch.topic), 0)::int AS old_partitions,
    coalesce((SELECT max(f.partitions) FROM ferry_inbox_fence f WHERE f.consumer = ch.consumer AND f.plan = ch.plan
              AND f.side = 'new' AND f.topic = ch.peer), 0)::int AS new_partitions
FROM ferry_inbox_channel ch
WHERE ch.consumer = @consumer AND ch.side = 'old';

-- name: InboxQuarantineAwaited :many
-- The partitions where the authoritative copies of the consumer's shadows
-- older than @after_seconds, never applied nor accounted for, would be
-- (plan, the authoritative side, topic, partition), but those a fence
-- passed since tells already: the group's position there decides.
SELECT DISTINCT c.plan, (CASE c.side WHEN 'old' THEN 'new' ELSE 'old' END)::text AS side,
       c.auth_topic::text AS topic, c.auth_partition::int AS partition
FROM ferry_inbox_copy c
WHERE c.consumer = @consumer AND c.role = 'shadow' AND c.topic IS NOT NULL AND c.auth_partition IS NOT NULL
  AND c.received_at < now() - make_interval(secs => @after_seconds::float8)
  AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = c.consumer AND i.message_id = c.message_id)
  AND NOT EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = c.consumer AND a.message_id = c.message_id
                  AND a.role = 'authoritative')
  AND NOT EXISTS (SELECT 1 FROM ferry_inbox_quarantine q WHERE q.consumer = c.consumer AND q.message_id = c.message_id)
  AND NOT EXISTS (SELECT 1 FROM ferry_inbox_fence f WHERE f.consumer = c.consumer AND f.plan = c.plan
                  AND f.side = (CASE c.side WHEN 'old' THEN 'new' ELSE 'old' END) AND f.topic = c.auth_topic
                  AND f.partition = c.auth_partition AND f.epoch > c.epoch);

-- name: InboxQuarantineShadows :execrows
-- Quarantines the events a consumer received a shadow copy of and never
-- applied nor dead-lettered, whose authoritative copy will not come: the
-- group consumed the partition it was written to past where it would be.
-- Either it passed there a fence of a later epoch than the copies' (written
-- after every record of the earlier steps), or it consumed everything the
-- partition held at a time (@reached_at, per partition) at least
-- @after_seconds after the shadow came: the relay writes an event's two
-- copies together, and @after_seconds bounds how far apart they reach
-- their clusters.
WITH r AS (
    SELECT unnest(@reached_plans::text[]) AS plan, unnest(@reached_sides::text[]) AS side,
           unnest(@reached_topics::text[]) AS topic, unnest(@reached_partitions::int[]) AS partition,
           unnest(@reached_at::timestamptz[]) AS at
)
INSERT INTO ferry_inbox_quarantine (consumer, message_id, plan, side, topic, partition, record_offset,
    record_key, record_value, record_headers, reason, received_at)
SELECT c.consumer, c.message_id, c.plan, c.side, c.topic, c.partition, c.record_offset,
       c.record_key, c.record_value, c.record_headers,
       'its authoritative copy will not come: the group consumed partition ' || c.auth_partition || ' of '
           || c.auth_topic || ' on the ' || (CASE c.side WHEN 'old' THEN 'new' ELSE 'old' END)
           || ' channel past it; the shadow copy from the ' || c.side || ' channel stands in for it',
       c.received_at
FROM ferry_inbox_copy c
WHERE c.consumer = @consumer AND c.role = 'shadow' AND c.topic IS NOT NULL AND c.auth_partition IS NOT NULL
  -- within the inbox's retention (0: none): past it, an applied event's
  -- inbox row may be gone
  AND (@within_seconds::float8 = 0 OR c.received_at > now() - make_interval(secs => @within_seconds::float8))
  AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = c.consumer AND i.message_id = c.message_id)
  -- an authoritative copy dead-lettered is accounted for by its dead letter
  AND NOT EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = c.consumer AND a.message_id = c.message_id
                  AND a.role = 'authoritative')
  AND (EXISTS (SELECT 1 FROM ferry_inbox_fence f WHERE f.consumer = c.consumer AND f.plan = c.plan
               AND f.side = (CASE c.side WHEN 'old' THEN 'new' ELSE 'old' END) AND f.topic = c.auth_topic
               AND f.partition = c.auth_partition AND f.epoch > c.epoch)
       OR EXISTS (SELECT 1 FROM r
                  WHERE r.plan = c.plan AND r.side = (CASE c.side WHEN 'old' THEN 'new' ELSE 'old' END)
                    AND r.topic = c.auth_topic AND r.partition = c.auth_partition
                    AND c.received_at <= r.at - make_interval(secs => @after_seconds::float8)))
-- A replay spends the shadow's record and deletes the quarantined event in
-- one statement (InboxQuarantineDelete), the shadow's row first. Locking it
-- here makes this statement wait for a replay in progress and then read the
-- spent record, which no longer qualifies; without the lock it would insert
-- from its older snapshot once the replay's delete freed the conflict, and
-- quarantine the replayed event again. Both take the shadow's row before
-- the quarantine's, so they cannot deadlock.
FOR NO KEY UPDATE OF c
ON CONFLICT (consumer, message_id) DO NOTHING;

-- name: InboxQuarantineCount :one
SELECT count(*)::bigint FROM ferry_inbox_quarantine WHERE consumer = @consumer AND plan = @plan;

-- name: InboxQuarantineList :many
SELECT * FROM ferry_inbox_quarantine
WHERE (sqlc.narg('consumer')::text IS NULL OR consumer = sqlc.narg('consumer'))
ORDER BY quarantined_at, consumer, message_id;

-- name: InboxQuarantineHolds :one
SELECT EXISTS (SELECT 1 FROM ferry_inbox_quarantine WHERE consumer = @consumer AND message_id = @message_id);

-- name: InboxQuarantineDelete :execrows
-- Takes a replayed event out of the quarantine and spends its shadow's
-- record: the replay is in the normal flow (applied, or dead-lettered), so
-- the shadow never quarantines it again.
-- The shadow's row is updated first: the scalar subquery on spent is an
-- InitPlan, run before the quarantine's row is deleted (and locked), the
-- order InboxQuarantineShadows takes them in.
WITH spent AS (
    UPDATE ferry_inbox_copy c SET topic = NULL, partition = NULL, record_offset = NULL,
        record_key = NULL, record_value = NULL, record_headers = NULL
    WHERE c.consumer = @consumer AND c.message_id = @message_id AND c.role = 'shadow'
      AND EXISTS (SELECT 1 FROM ferry_inbox_quarantine q WHERE q.consumer = @consumer AND q.message_id = @message_id)
    RETURNING 1
)
DELETE FROM ferry_inbox_quarantine d WHERE d.consumer = @consumer AND d.message_id = @message_id
  AND (SELECT count(*) FROM spent) >= 0;

-- name: InboxShadowScanLoad :one
-- Where the consumer's last quarantine pass left its next one to read
-- the shadows from; no row before a first pass.
SELECT since, inflight FROM ferry_inbox_shadow_scan WHERE consumer = @consumer;

-- name: InboxShadowScanSave :exec
-- Records where the consumer's next quarantine pass reads its shadows
-- from.
INSERT INTO ferry_inbox_shadow_scan (consumer, since, inflight)
VALUES (@consumer, @since, @inflight)
ON CONFLICT (consumer) DO UPDATE SET since = excluded.since, inflight = excluded.inflight, saved_at = now();
