-- A live migration's shadow report and quarantine pass (every
-- MigrationReportInterval) read the copies recorded since the ones before
-- them, not every copy of their window or of the migration: each copy
-- keeps the transaction that recorded it (xact), and they read from a
-- horizon below which every transaction had ended. The shadows located
-- (awaiting an authoritative copy that is late) have an index of their
-- own, which the pass keeps to those not applied.

-- +goose Up
ALTER TABLE ferry_inbox_copy ADD COLUMN xact xid8;
ALTER TABLE ferry_inbox_copy ALTER COLUMN xact SET DEFAULT pg_current_xact_id();

-- The shadows recorded before, neither located nor applied nor accounted
-- for, are read by the first pass.
UPDATE ferry_inbox_copy c SET xact = '0'
WHERE c.role = 'shadow' AND c.topic IS NOT NULL AND c.auth_partition IS NULL
  AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = c.consumer AND i.message_id = c.message_id)
  AND NOT EXISTS (SELECT 1 FROM ferry_inbox_copy a WHERE a.consumer = c.consumer AND a.message_id = c.message_id
                  AND a.role = 'authoritative');

CREATE INDEX ferry_inbox_copy_xact_idx ON ferry_inbox_copy (consumer, xact);
CREATE INDEX ferry_inbox_copy_located_idx ON ferry_inbox_copy (consumer)
    WHERE role = 'shadow' AND topic IS NOT NULL AND auth_partition IS NOT NULL;

-- +goose Down
DROP INDEX ferry_inbox_copy_located_idx;
DROP INDEX ferry_inbox_copy_xact_idx;
ALTER TABLE ferry_inbox_copy DROP COLUMN xact;
