-- The relay follows a live broker migration from the WAL (package
-- migration): it decodes the inserts of ferry_migration_step in the same
-- stream as the outbox rows and routes every event by the step in effect at
-- its commit. These columns let it survive a restart and tell steps apart
-- across plans.

-- +goose Up
-- seq orders the steps of every plan. The controller takes one lock for
-- every request (pg_advisory_xact_lock), so steps commit in seq order.
ALTER TABLE ferry_migration_step ADD COLUMN seq bigserial NOT NULL;
CREATE UNIQUE INDEX ferry_migration_step_seq_idx ON ferry_migration_step (seq);

-- The newest step the relay applied on a slot (route_seq) and the end of its
-- transaction (route_lsn). The relay writes them before it confirms that
-- transaction and reads no further until it has, so at most one step is
-- unconfirmed: at a restart, a confirmed position at or past route_lsn means
-- the step is in effect; before it, the stream delivers the step again at
-- its point. route_seq 0 with route_lsn NULL: no step applied on the slot.
ALTER TABLE ferry_relay_slot
    ADD COLUMN route_seq bigint,
    ADD COLUMN route_lsn pg_lsn;

-- +goose Down
ALTER TABLE ferry_relay_slot DROP COLUMN route_lsn, DROP COLUMN route_seq;
DROP INDEX ferry_migration_step_seq_idx;
ALTER TABLE ferry_migration_step DROP COLUMN seq;
