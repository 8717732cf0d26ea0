-- name: ReplicationSlotGet :one
-- Everything the relay reads about its slot: for `relay status`, the WAL
-- monitor, the start-up checks and where a session resumes. An unset
-- pg_lsn, plugin or wal_status reads as the empty string.
-- (pg_catalog is spelled out: sqlc resolves these catalog relations only
-- when qualified.)
SELECT
    coalesce(plugin, '')::text                    AS plugin,
    coalesce(active, false)::bool                 AS active,
    coalesce(active_pid, 0)::int                  AS active_pid,
    coalesce(confirmed_flush_lsn::text, '')::text AS confirmed_flush_lsn,
    coalesce(restart_lsn::text, '')::text         AS restart_lsn,
    coalesce(wal_status, '')::text                AS wal_status,
    -- a standby (which may hold a synchronized copy) has no current WAL
    -- position of its own: measure against what it replayed
    coalesce(pg_wal_lsn_diff(
        CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
        restart_lsn), 0)::bigint AS retained_wal_bytes,
    coalesce(database = current_database(), false)::bool AS same_database
FROM pg_catalog.pg_replication_slots
WHERE slot_name = @slot_name::text;

-- name: ReplicationSlotCreate :one
-- Returns the position the slot starts at. Fails with duplicate_object when
-- another process created the slot first.
SELECT lsn::text AS lsn FROM pg_create_logical_replication_slot(@slot_name::text, 'pgoutput');

-- name: ReplicationSlotConfirmed :one
-- Whether the slot confirmed the position, that is the relay published
-- everything committed below it. No row when the slot does not exist.
SELECT coalesce(confirmed_flush_lsn >= pg_lsn(@lsn::text), false)::bool AS confirmed
FROM pg_catalog.pg_replication_slots
WHERE slot_name = @slot_name::text;

-- name: ReplicationSlotDrop :exec
-- Fails when a process streams from the slot.
SELECT pg_drop_replication_slot(@slot_name::text);
