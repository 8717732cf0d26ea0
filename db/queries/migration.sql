-- name: MigrationCreate :exec
INSERT INTO ferry_migration (name, old_channel, new_channel, groups, created_by)
VALUES (@name, @old_channel, @new_channel, @groups, @created_by);

-- name: MigrationGet :one
SELECT * FROM ferry_migration WHERE name = @name;

-- name: MigrationLock :one
-- Serializes the requests of one plan.
SELECT name FROM ferry_migration WHERE name = @name FOR UPDATE;

-- name: MigrationList :many
SELECT * FROM ferry_migration ORDER BY created_at, name;

-- name: MigrationStepCurrent :one
SELECT * FROM ferry_migration_step WHERE migration = @migration ORDER BY epoch DESC LIMIT 1;

-- name: MigrationStepInsert :exec
INSERT INTO ferry_migration_step (migration, epoch, phase, slices, request_id)
VALUES (@migration, @epoch, @phase, @slices, sqlc.narg('request_id'));

-- name: MigrationSteps :many
SELECT * FROM ferry_migration_step WHERE migration = @migration ORDER BY epoch;

-- name: MigrationNextPhase :one
-- The phase of a plan's first step after epoch (none: no rows).
SELECT phase FROM ferry_migration_step WHERE migration = @migration AND epoch > @epoch ORDER BY epoch LIMIT 1;

-- name: MigrationRequestInsert :one
INSERT INTO ferry_migration_request (migration, requested_by, from_phase, from_slices, to_phase, to_slices, accepted, reason)
VALUES (@migration, @requested_by, @from_phase, @from_slices, @to_phase, @to_slices, @accepted, @reason)
RETURNING id, requested_at;

-- name: MigrationRequests :many
SELECT * FROM ferry_migration_request WHERE migration = @migration ORDER BY id;

-- name: MigrationSerialize :exec
-- One lock for every plan's requests, so that steps commit in seq order
-- (the relay tells the steps in effect apart by seq).
SELECT pg_advisory_xact_lock(7236051611);

-- name: MigrationActiveOther :many
-- The other plans in the middle of a migration (DUAL_WRITE or CUTOVER): a
-- relay follows one at a time.
SELECT s.migration, s.phase FROM ferry_migration_step s
WHERE s.migration <> @migration
  AND s.epoch = (SELECT max(epoch) FROM ferry_migration_step t WHERE t.migration = s.migration)
  AND s.phase IN ('DUAL_WRITE', 'CUTOVER')
ORDER BY s.migration;

-- name: MigrationStepsThrough :many
-- Every step up to seq, in commit order: what a relay has applied.
SELECT migration, epoch, phase, slices, seq FROM ferry_migration_step WHERE seq <= @seq ORDER BY seq;

-- name: MigrationStepNewest :one
SELECT coalesce(max(seq), 0)::bigint AS seq FROM ferry_migration_step;
