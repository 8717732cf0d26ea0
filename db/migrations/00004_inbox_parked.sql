-- inbox_parked holds the messages a worker could neither apply nor
-- dead-letter: the handler gave up on them and Kafka refuses their dead
-- letter for good (it is larger than the dead-letter topic or the producer
-- accepts: a dead letter carries more headers than the original). Parking
-- one here, durably and with both reasons, lets its partition move on
-- instead of retrying the dead letter forever. `worker dlq parked` lists
-- them; a redrive republishes one to its original topic and partition
-- (it came from there, so it fits) and deletes it here.

-- +goose Up
CREATE TABLE inbox_parked (
    consumer          text        NOT NULL,
    topic             text        NOT NULL,
    kafka_partition   int         NOT NULL,
    kafka_offset      bigint      NOT NULL,
    message_id        text        NOT NULL,  -- '' when the record had none
    record_key        bytea,
    record_value      bytea,
    header_keys       text[]      NOT NULL,
    header_values     bytea[]     NOT NULL,
    record_timestamp  timestamptz NOT NULL,
    reason            text        NOT NULL,  -- why it was dead-lettered (inbox.ReasonXxx)
    error             text        NOT NULL,  -- the handler's (or decoder's) error
    attempts          int         NOT NULL,
    dead_letter_error text        NOT NULL,  -- why Kafka refused the dead letter
    parked_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, kafka_partition, kafka_offset)
);

-- +goose Down
DROP TABLE inbox_parked;
