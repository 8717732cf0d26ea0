-- A live broker migration moves a running system from one Kafka channel
-- (cluster and topic template) to another while events flow (package
-- migration). Its plan and every request to change its phase live here, in
-- the producer's database, so that a change takes effect without a redeploy
-- and a rollback is immediate.

-- +goose Up
-- ferry_migration is a plan: the two channels and the consumer groups that
-- must follow. A channel is {"brokers": [...], "topic_template": "...", and
-- TLS/SASL settings}; a SASL password is never stored, only the name of
-- the environment variable that holds it.
CREATE TABLE ferry_migration (
    name        text        PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    old_channel jsonb       NOT NULL CHECK (jsonb_typeof(old_channel) = 'object'),
    new_channel jsonb       NOT NULL CHECK (jsonb_typeof(new_channel) = 'object'),
    groups      text[]      NOT NULL CHECK (cardinality(groups) > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text        NOT NULL
);

-- ferry_migration_request records every request to change a plan's phase,
-- accepted or not, with who, when, from, to and why it was rejected (M4).
CREATE TABLE ferry_migration_request (
    id           bigserial   PRIMARY KEY,
    migration    text        NOT NULL REFERENCES ferry_migration (name),
    requested_at timestamptz NOT NULL DEFAULT now(),
    requested_by text        NOT NULL,
    from_phase   text        NOT NULL,
    from_slices  int         NOT NULL,
    to_phase     text        NOT NULL,
    to_slices    int         NOT NULL,
    accepted     boolean     NOT NULL,
    reason       text        NOT NULL  -- why it was rejected; what it did when accepted
);
CREATE INDEX ferry_migration_request_migration_idx ON ferry_migration_request (migration, id);

-- ferry_migration_step holds the accepted changes, one row each, epoch 0
-- being the plan's creation (OLD_ONLY). The newest row is the plan's
-- phase. The relay reads these inserts from the WAL, so a change takes
-- effect at its exact point in the commit order: every event committed
-- before it is routed the old way, every one after it the new way.
CREATE TABLE ferry_migration_step (
    migration  text        NOT NULL REFERENCES ferry_migration (name),
    epoch      int         NOT NULL CHECK (epoch >= 0),
    phase      text        NOT NULL CHECK (phase IN ('OLD_ONLY', 'DUAL_WRITE', 'CUTOVER', 'OLD_RETIRED')),
    slices     int         NOT NULL CHECK (slices BETWEEN 0 AND 128),
    request_id bigint      REFERENCES ferry_migration_request (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (migration, epoch)
);

-- +goose Down
DROP TABLE ferry_migration_step;
DROP TABLE ferry_migration_request;
DROP TABLE ferry_migration;
