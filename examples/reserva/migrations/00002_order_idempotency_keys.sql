-- Idempotency-Key of POST /orders: a client that retries with the same key
-- gets the order its first request made, never a second one.

-- +goose Up
CREATE TABLE order_idempotency_keys (
    key          text        PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the request as decoded: the same key with another request
    -- is refused, not answered with an order the client did not ask for.
    request_hash bytea       NOT NULL CHECK (octet_length(request_hash) = 32),
    -- Deferred: the key is claimed first, before the order exists, so that
    -- concurrent requests with one key queue on it before writing anything.
    order_id     uuid        NOT NULL UNIQUE REFERENCES orders (id) DEFERRABLE INITIALLY DEFERRED,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- +goose Down
DROP TABLE order_idempotency_keys;
