-- name: RelaySlotGet :one
-- What Ferry knows of a slot it published from; no row if none.
SELECT
    slot_name,
    system_identifier,
    created_lsn::text   AS created_lsn,
    created_at,
    confirmed_lsn::text AS confirmed_lsn,
    confirmed_commit_at,
    recovering_since,
    updated_at,
    first_created_at
FROM ferry_relay_slot
WHERE slot_name = @slot_name::text;

-- name: RelaySlotCreated :exec
-- Records a slot the relay just created, at its creation position: a slot
-- created again under the same name starts the record over, and a
-- recovery that made it is finished. route_seq is the newest migration step
-- before the slot's start (NULL: unknown, for a slot found without record).
-- created says Ferry created the slot (false: it found one an administrator
-- made); the first time it did stays in first_created_at.
INSERT INTO ferry_relay_slot (slot_name, system_identifier, created_lsn, confirmed_lsn, confirmed_commit_at, route_seq, first_created_at)
SELECT @slot_name::text, s.system_identifier::text, pg_lsn(@created_lsn::text), pg_lsn(@created_lsn::text),
       sqlc.narg('confirmed_commit_at')::timestamptz, sqlc.narg('route_seq')::bigint,
       CASE WHEN @created::boolean THEN now() END
FROM pg_control_system() s
ON CONFLICT (slot_name) DO UPDATE SET
    first_created_at    = coalesce(ferry_relay_slot.first_created_at, excluded.first_created_at),
    route_seq           = excluded.route_seq,
    route_lsn           = NULL,
    system_identifier   = excluded.system_identifier,
    created_lsn         = excluded.created_lsn,
    created_at          = now(),
    confirmed_lsn       = excluded.confirmed_lsn,
    confirmed_commit_at = excluded.confirmed_commit_at,
    recovering_since    = NULL,
    updated_at          = now();

-- name: RelaySlotConfirmed :execrows
-- Moves the record forward to what the relay confirmed; never back.
UPDATE ferry_relay_slot
SET confirmed_lsn       = pg_lsn(@confirmed_lsn::text),
    confirmed_commit_at = coalesce(sqlc.narg('confirmed_commit_at')::timestamptz, confirmed_commit_at),
    updated_at          = now()
WHERE slot_name = @slot_name::text
  AND confirmed_lsn <= pg_lsn(@confirmed_lsn::text);

-- name: SystemIdentifier :one
-- The server's identity, shared by a primary and its physical standbys.
SELECT system_identifier::text AS system_identifier FROM pg_control_system();

-- name: RelaySlotRecovering :exec
-- Marks a recovery as begun: until RelaySlotCreated ends it, no relay
-- streams from the slot.
INSERT INTO ferry_relay_slot (slot_name, system_identifier, created_lsn, confirmed_lsn, recovering_since)
SELECT @slot_name::text, s.system_identifier::text, '0/0'::pg_lsn, '0/0'::pg_lsn, @since::timestamptz
FROM pg_control_system() s
ON CONFLICT (slot_name) DO UPDATE SET
    recovering_since = excluded.recovering_since,
    updated_at       = now();

-- name: RelaySlotRoute :one
-- The newest migration step the relay applied on the slot and the end of its
-- transaction (see migration 00006). route_seq is NULL for a slot recorded
-- before the relay followed migrations.
SELECT route_seq, coalesce(route_lsn::text, '')::text AS route_lsn FROM ferry_relay_slot WHERE slot_name = @slot_name::text;

-- name: RelaySlotRouteSet :exec
-- Records a step applied on the slot: at lsn (the end of the step's
-- transaction), or with a NULL lsn when it was in effect from the slot's
-- start.
UPDATE ferry_relay_slot
SET route_seq = @route_seq::bigint, route_lsn = pg_lsn(sqlc.narg('route_lsn')::text), updated_at = now()
WHERE slot_name = @slot_name::text;
