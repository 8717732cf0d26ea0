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
-- before the slot's start, in effect from it: the slot's steps
-- (route_steps) start over with it alone (NULL: unknown, for a slot found
-- without record). created says Ferry created the slot (false: it found
-- one an administrator made); the first time it did stays in
-- first_created_at.
INSERT INTO ferry_relay_slot (slot_name, system_identifier, created_lsn, confirmed_lsn, confirmed_commit_at, route_steps, first_created_at)
SELECT @slot_name::text, s.system_identifier::text, pg_lsn(@created_lsn::text), pg_lsn(@created_lsn::text),
       sqlc.narg('confirmed_commit_at')::timestamptz,
       CASE WHEN sqlc.narg('route_seq')::bigint IS NOT NULL
            THEN jsonb_build_object(coalesce(sqlc.narg('route_seq')::bigint, 0)::text, '0/0') END,
       CASE WHEN @created::boolean THEN now() END
FROM pg_control_system() s
ON CONFLICT (slot_name) DO UPDATE SET
    first_created_at    = coalesce(ferry_relay_slot.first_created_at, excluded.first_created_at),
    route_steps         = excluded.route_steps,
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

-- name: RelaySlotSteps :many
-- The migration steps the relay applied on the slot, oldest first, each
-- with the position from which it is in effect (0/0: from the slot's
-- start). None for a slot recorded before the relay followed migrations.
SELECT e.key::bigint AS seq, e.value::pg_lsn::text AS lsn
FROM ferry_relay_slot s, jsonb_each_text(s.route_steps) e
WHERE s.slot_name = @slot_name::text
ORDER BY 1;

-- name: RelaySlotStepApplied :execrows
-- Records a step applied on the slot, in effect from lsn: the end of the
-- step's transaction, or 0/0 when it was in effect from the slot's start.
-- Applied again (the stream delivers it again after a restart) it is at
-- the same position.
UPDATE ferry_relay_slot
SET route_steps = coalesce(route_steps, '{}') || jsonb_build_object((@seq::bigint)::text, pg_lsn(@lsn::text)::text),
    updated_at  = now()
WHERE slot_name = @slot_name::text;

-- name: RelaySlotStepsPrune :execrows
-- Forgets the steps older than the one in effect at lsn, a position the
-- slot never resumes before again; nothing when no step is in effect
-- there.
UPDATE ferry_relay_slot s
SET route_steps = (SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each_text(s.route_steps) e WHERE e.value::pg_lsn >= k.at)
FROM (SELECT max(e.value::pg_lsn) AS at
      FROM ferry_relay_slot r, jsonb_each_text(r.route_steps) e
      WHERE r.slot_name = @slot_name::text AND e.value::pg_lsn <= pg_lsn(@lsn::text)) k
WHERE s.slot_name = @slot_name::text
  AND EXISTS (SELECT 1 FROM jsonb_each_text(s.route_steps) e WHERE e.value::pg_lsn < k.at);
