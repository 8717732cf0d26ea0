-- An outbox row's own headers may not use a name Ferry reserves: the four
-- the relay sets on every record (id, event_type, aggregate_type,
-- aggregate_id) and Ferry's namespace, "ferry." (the dead-letter and
-- redrive headers). A row written with SQL could otherwise carry a second
-- event_type that a consumer reads instead of the relay's, or ferry.dlq.*
-- headers that pose as a dead letter. The Go writer refuses such headers
-- (outbox.IsReservedHeader); this refuses them from any other writer. NOT
-- VALID: rows already written are not checked (the relay quarantines any
-- that has one, reason reserved_header); every new row is.

-- +goose Up
ALTER TABLE outbox ADD CONSTRAINT outbox_headers_not_reserved CHECK (
    NOT (headers ?| ARRAY['id', 'event_type', 'aggregate_type', 'aggregate_id'])
    AND NOT jsonb_path_exists(headers, '$.keyvalue() ? (@.key starts with "ferry.")')
) NOT VALID;

-- +goose Down
ALTER TABLE outbox DROP CONSTRAINT outbox_headers_not_reserved;
