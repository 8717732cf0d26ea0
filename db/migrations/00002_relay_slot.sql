-- ferry_relay_slot remembers each replication slot a relay has published
-- from. PostgreSQL forgets a slot on a failover (before 17), a restore or a
-- drop; a relay that then created a new slot would start at "now" and skip
-- every event committed in between. With this row it knows the slot is gone,
-- stops with an explained error, and `relay recover` knows from where to
-- republish the outbox.

-- +goose Up
CREATE TABLE ferry_relay_slot (
    slot_name           text        PRIMARY KEY,
    -- the server the slot lives on: pg_control_system().system_identifier,
    -- shared by a primary and its physical standbys
    system_identifier   text        NOT NULL,
    -- the WAL position at which the slot was created
    created_lsn         pg_lsn      NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- the newest position the relay confirmed (behind Kafka's acks) and the
    -- commit time of the newest transaction before it; updated every few
    -- seconds, so it may lag the slot, never lead it
    confirmed_lsn       pg_lsn      NOT NULL,
    confirmed_commit_at timestamptz,
    -- set while `relay recover` republishes the outbox from this time on;
    -- a relay refuses to stream from a slot whose recovery did not finish
    recovering_since    timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE ferry_relay_slot;
