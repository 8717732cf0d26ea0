-- Where a live migration's shadow copy's authoritative copy was written: the
-- topic and partition of the other channel (from the channel the fences
-- named, their partition counts and the record's key). The quarantine
-- judges an event never applied against the group's position there, not
-- against the clock: a group that lags on that partition has its copy to
-- come.

-- +goose Up
ALTER TABLE ferry_inbox_copy
    ADD COLUMN auth_topic     text,
    ADD COLUMN auth_partition int;

-- +goose Down
ALTER TABLE ferry_inbox_copy DROP COLUMN auth_partition, DROP COLUMN auth_topic;
