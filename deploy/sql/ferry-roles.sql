-- Least-privilege roles for the relay and a worker, as docs/relay.md
-- (Least privilege) and docs/security.md list them. Run it as an administrator in the
-- application's database after `relay migrate` (and the worker's
-- `migrate`), which create the tables granted here; set the passwords
-- apart (\password ferry_relay in psql) so that none sits in a file.
-- The relay then runs with --no-create.

CREATE ROLE ferry_relay LOGIN REPLICATION;
GRANT SELECT ON outbox TO ferry_relay;
GRANT SELECT, INSERT ON outbox_quarantine TO ferry_relay;         -- events Kafka refuses; relay status
GRANT SELECT, INSERT, UPDATE ON ferry_relay_slot TO ferry_relay;  -- what the slot confirmed, for recovery
GRANT DELETE ON outbox TO ferry_relay;                             -- outbox retention (or --prune-interval 0)
GRANT SELECT ON ferry_migration, ferry_migration_step TO ferry_relay;  -- live broker migration plans

-- A worker (here reserva's; one role per worker application), in the
-- worker's database, plus what its handlers touch (reserva's: its tables, and
-- INSERT on outbox for the events they write).
CREATE ROLE reserva_worker LOGIN;
GRANT SELECT, INSERT, DELETE ON inbox TO reserva_worker;          -- DELETE: inbox retention
GRANT INSERT ON inbox_parked TO reserva_worker;                   -- SELECT, DELETE too for `dlq parked`
GRANT SELECT, INSERT ON ferry_inbox_channel TO reserva_worker;    -- live broker migrations
GRANT SELECT, INSERT, UPDATE ON ferry_inbox_fence TO reserva_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON ferry_inbox_copy TO reserva_worker; -- UPDATE: the migration quarantine; DELETE: retention
GRANT SELECT, INSERT, DELETE ON ferry_inbox_quarantine TO reserva_worker;
GRANT SELECT, INSERT, UPDATE ON ferry_inbox_shadow_scan TO reserva_worker; -- where the quarantine passes resume
