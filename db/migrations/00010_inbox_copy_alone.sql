-- A live migration's copies that the relay wrote to one channel only (the
-- authoritative copies of OLD_RETIRED, on the new channel) have no shadow
-- to miss: the shadow report leaves them out of its missing shadows.

-- +goose Up
ALTER TABLE ferry_inbox_copy ADD COLUMN alone boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE ferry_inbox_copy DROP COLUMN alone;
