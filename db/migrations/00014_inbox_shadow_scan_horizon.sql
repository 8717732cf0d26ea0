-- Where a consumer's next migration quarantine pass reads its shadow
-- copies from, kept across a worker's restarts: every shadow recorded by a
-- transaction from since on, or by one of inflight. A worker's first pass
-- after a start read every shadow of the migration without it. Each
-- pass's worker writes it once the pass committed; an older row only
-- makes a pass read more.

-- +goose Up
CREATE TABLE ferry_inbox_shadow_scan (
    consumer text PRIMARY KEY,
    since xid8 NOT NULL,
    inflight xid8[] NOT NULL,
    saved_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE ferry_inbox_shadow_scan;
