-- Reserva's own tables, recorded in reserva_schema_version beside Ferry's.

-- +goose Up
CREATE TABLE stock (
    sku       text PRIMARY KEY,
    name      text NOT NULL,
    available int  NOT NULL CHECK (available >= 0)
);

CREATE TABLE orders (
    id          uuid        PRIMARY KEY,
    customer    text        NOT NULL,
    status      text        NOT NULL DEFAULT 'placed' CHECK (status IN ('placed', 'reserved', 'rejected')),
    reason      text,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    decided_at  timestamptz
);

CREATE TABLE order_items (
    order_id uuid NOT NULL REFERENCES orders (id),
    sku      text NOT NULL,
    qty      int  NOT NULL CHECK (qty > 0),
    PRIMARY KEY (order_id, sku)
);

-- The stock worker's effect: one outcome per order, whatever Kafka repeats.
CREATE TABLE reservations (
    order_id   uuid        PRIMARY KEY,
    outcome    text        NOT NULL CHECK (outcome IN ('reserved', 'rejected')),
    reason     text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- +goose Down
DROP TABLE reservations;
DROP TABLE order_items;
DROP TABLE orders;
DROP TABLE stock;
