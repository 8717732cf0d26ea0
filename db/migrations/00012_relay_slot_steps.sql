-- The migration steps a relay applied on a slot, each with the position
-- from which it is in effect (relay/step_history.go), replace route_seq and
-- route_lsn (migration 00006), which kept the newest step alone: a
-- restarted relay took the one before it as in effect whenever its
-- confirmed position was before route_lsn. That holds only while at most
-- one step is past the slot's confirmed position. Two can be (the relay
-- records a step before PostgreSQL hears that the previous one was
-- confirmed), and a restart of PostgreSQL takes a slot's confirmed
-- position back to where it last saved the slot, past any number of them.
-- A column of the slot's row, not a table: the relay's role writes it
-- with the grants it has, and one UPDATE changes it whole.

-- +goose Up
-- {"<ferry_migration_step.seq>": "<pg_lsn from which it is in effect>"};
-- 0/0: from the slot's start; seq 0: no step. NULL: unknown, for a slot
-- recorded before the relay followed migrations.
ALTER TABLE ferry_relay_slot ADD COLUMN route_steps jsonb CHECK (jsonb_typeof(route_steps) = 'object');

-- What route_seq and route_lsn said: the recorded step from route_lsn on
-- (from the start when NULL), and before route_lsn the step before it.
UPDATE ferry_relay_slot s
SET route_steps = jsonb_build_object(s.route_seq::text, coalesce(s.route_lsn, '0/0')::text) ||
    CASE WHEN s.route_lsn IS NULL THEN '{}'::jsonb
         ELSE jsonb_build_object(coalesce((SELECT max(m.seq) FROM ferry_migration_step m WHERE m.seq < s.route_seq), 0)::text, '0/0')
    END
WHERE s.route_seq IS NOT NULL;

ALTER TABLE ferry_relay_slot DROP COLUMN route_lsn, DROP COLUMN route_seq;

-- +goose Down
ALTER TABLE ferry_relay_slot
    ADD COLUMN route_seq bigint,
    ADD COLUMN route_lsn pg_lsn;
UPDATE ferry_relay_slot s
SET route_seq = h.seq, route_lsn = nullif(h.lsn, '0/0')
FROM (SELECT DISTINCT ON (r.slot_name) r.slot_name, e.key::bigint AS seq, e.value::pg_lsn AS lsn
      FROM ferry_relay_slot r, jsonb_each_text(r.route_steps) e
      ORDER BY r.slot_name, e.key::bigint DESC) h
WHERE h.slot_name = s.slot_name;
ALTER TABLE ferry_relay_slot DROP COLUMN route_steps;
