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
INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at)
VALUES (@consumer, @message_id, @plan, @side, @role, @epoch, @digest, @received_at)
ON CONFLICT (consumer, message_id, side) DO NOTHING;
