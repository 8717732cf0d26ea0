-- name: InboxParkedInsert :exec
-- A worker that parks the same record again (it restarted before committing
-- the offset) keeps the first.
INSERT INTO inbox_parked (
    consumer, topic, kafka_partition, kafka_offset, message_id, record_key, record_value,
    header_keys, header_values, record_timestamp, reason, error, attempts, dead_letter_error
) VALUES (
    @consumer, @topic, @kafka_partition, @kafka_offset, @message_id, @record_key, @record_value,
    @header_keys, @header_values, @record_timestamp, @reason, @error, @attempts, @dead_letter_error
)
ON CONFLICT (consumer, topic, kafka_partition, kafka_offset) DO NOTHING;

-- name: InboxParkedList :many
-- Parked messages, oldest first; an empty consumer means every consumer.
SELECT * FROM inbox_parked
WHERE @consumer::text = '' OR consumer = @consumer::text
ORDER BY parked_at, consumer, topic, kafka_partition, kafka_offset
LIMIT @max_rows::int;

-- name: InboxParkedDelete :execrows
DELETE FROM inbox_parked
WHERE consumer = @consumer AND topic = @topic AND kafka_partition = @kafka_partition AND kafka_offset = @kafka_offset;
