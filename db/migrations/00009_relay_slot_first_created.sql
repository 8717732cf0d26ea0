-- When Ferry first created a slot of this name (relay migrate, run or
-- recover), kept when the slot is created again: no slot of that name
-- streamed a transaction committed before it, so a recovery's window that
-- reaches back further cannot miss a row from before it (relay/recover.go).
-- NULL when Ferry only found a slot an administrator made, and for a slot
-- recorded before this column existed: recover then bounds nothing.

-- +goose Up
ALTER TABLE ferry_relay_slot ADD COLUMN first_created_at timestamptz;

-- +goose Down
ALTER TABLE ferry_relay_slot DROP COLUMN first_created_at;
