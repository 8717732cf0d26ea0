-- Ferry's own tables. Goose records this file in ferry_schema_version, not in
-- goose_db_version, so an application's goose migrations live beside it.

-- +goose Up

-- outbox holds events that application transactions write next to their
-- business rows. The relay reads inserts from the WAL, never by polling, so
-- the table is insert-only: rows are deleted only by retention.
--
-- payload is bytea: the relay hands Kafka these bytes unchanged, so JSON,
-- protobuf and Avro payloads all travel untouched. headers is a JSON object
-- whose values are strings; they become Kafka record headers.
CREATE TABLE outbox (
    id             uuid        PRIMARY KEY,
    aggregate_type text        NOT NULL CHECK (aggregate_type <> ''),
    aggregate_id   text        NOT NULL CHECK (aggregate_id <> ''),
    event_type     text        NOT NULL CHECK (event_type <> ''),
    payload        bytea       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(headers) = 'object'),
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- Retention deletes the oldest rows in small batches.
CREATE INDEX outbox_created_at_idx ON outbox (created_at);

-- inbox records every message a consumer has applied. The primary key turns a
-- redelivery into a conflict, and the conflict into a no-op.
CREATE TABLE inbox (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX inbox_processed_at_idx ON inbox (processed_at);

-- outbox_quarantine keeps the events Kafka refuses for good (too large, an
-- invalid topic name, ...), with the reason, so that none disappears silently.
CREATE TABLE outbox_quarantine (
    id             uuid        PRIMARY KEY,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        bytea       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL,
    topic          text        NOT NULL,
    reason         text        NOT NULL,
    error          text        NOT NULL,
    commit_lsn     pg_lsn,
    quarantined_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX outbox_quarantine_quarantined_at_idx ON outbox_quarantine (quarantined_at);

-- +goose Down
DROP TABLE outbox_quarantine;
DROP TABLE inbox;
DROP TABLE outbox;
