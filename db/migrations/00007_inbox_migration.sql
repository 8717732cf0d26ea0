-- A worker follows a live broker migration by itself (package migration):
-- what it learns from the channels lives here, in the consumer's database,
-- shared by every instance of a consumer group.

-- +goose Up
-- The channels a consumer learned of from fences: a fence on topic `topic`
-- of side `side` names `peer`, the topic of the same events on the other
-- channel, and carries that channel (brokers, topic template, TLS and SASL
-- settings; a password only by the name of its environment variable).
CREATE TABLE ferry_inbox_channel (
    consumer   text        NOT NULL,
    plan       text        NOT NULL,
    side       text        NOT NULL CHECK (side IN ('old', 'new')),
    topic      text        NOT NULL,
    peer       text        NOT NULL,
    channel    jsonb       NOT NULL CHECK (jsonb_typeof(channel) = 'object'),
    learned_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, plan, side, topic)
);

-- The newest fence a consumer passed on each partition: every record
-- before it on that partition is applied (or dead-lettered).
CREATE TABLE ferry_inbox_fence (
    consumer   text        NOT NULL,
    plan       text        NOT NULL,
    side       text        NOT NULL CHECK (side IN ('old', 'new')),
    topic      text        NOT NULL,
    partition  int         NOT NULL,
    epoch      int         NOT NULL,
    partitions int         NOT NULL CHECK (partitions > 0),
    passed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, plan, side, topic, partition)
);

-- Every stamped copy a consumer received during a migration: the shadow
-- copies it only compares, and the authoritative ones it applied. The
-- shadow gate compares them: missing copies, payload digests, lateness.
CREATE TABLE ferry_inbox_copy (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    plan        text        NOT NULL,
    side        text        NOT NULL CHECK (side IN ('old', 'new')),
    role        text        NOT NULL CHECK (role IN ('authoritative', 'shadow')),
    epoch       int         NOT NULL,
    digest      bytea       NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id, side)
);
CREATE INDEX ferry_inbox_copy_received_idx ON ferry_inbox_copy (consumer, plan, received_at);

-- +goose Down
DROP TABLE ferry_inbox_copy;
DROP TABLE ferry_inbox_fence;
DROP TABLE ferry_inbox_channel;
