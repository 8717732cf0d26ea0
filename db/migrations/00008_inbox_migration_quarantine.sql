-- A live migration's consumer-side quarantine (M3: quarantine, not
-- silence): an event whose shadow copy a consumer received but whose
-- authoritative copy it never applied (lost on the other channel, or late
-- beyond reason) is kept with everything needed to replay it.

-- +goose Up
-- A shadow copy keeps the record, so that it can stand in for a lost
-- authoritative copy; NULL for authoritative copies.
ALTER TABLE ferry_inbox_copy
    ADD COLUMN topic          text,
    ADD COLUMN partition      int,
    ADD COLUMN record_offset  bigint,
    ADD COLUMN record_key     bytea,
    ADD COLUMN record_value   bytea,
    ADD COLUMN record_headers jsonb;

CREATE TABLE ferry_inbox_quarantine (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    plan           text        NOT NULL,
    side           text        NOT NULL CHECK (side IN ('old', 'new')),
    topic          text        NOT NULL,
    partition      int         NOT NULL,
    record_offset  bigint      NOT NULL,
    record_key     bytea,
    record_value   bytea,
    record_headers jsonb       NOT NULL,
    reason         text        NOT NULL,
    received_at    timestamptz NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- +goose Down
DROP TABLE ferry_inbox_quarantine;
ALTER TABLE ferry_inbox_copy
    DROP COLUMN record_headers, DROP COLUMN record_value, DROP COLUMN record_key,
    DROP COLUMN record_offset, DROP COLUMN partition, DROP COLUMN topic;
