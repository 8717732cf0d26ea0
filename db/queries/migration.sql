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

-- name: MigrationRequestInsert :one
INSERT INTO ferry_migration_request (migration, requested_by, from_phase, from_slices, to_phase, to_slices, accepted, reason)
VALUES (@migration, @requested_by, @from_phase, @from_slices, @to_phase, @to_slices, @accepted, @reason)
RETURNING id, requested_at;

-- name: MigrationRequests :many
SELECT * FROM ferry_migration_request WHERE migration = @migration ORDER BY id;
