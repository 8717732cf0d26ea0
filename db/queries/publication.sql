-- name: PublicationGet :one
-- Whether the publication exists, publishes inserts and covers the outbox
-- table. Creating it is DDL with an identifier, which a query parameter
-- cannot carry: relay/slot.go builds that statement itself.
-- (pg_catalog is spelled out: sqlc resolves these catalog relations only
-- when qualified.)
SELECT
    p.pubinsert,
    (p.puballtables OR EXISTS (
        SELECT 1 FROM pg_catalog.pg_publication_rel r
        WHERE r.prpubid = p.oid AND r.prrelid = 'outbox'::regclass
    ))::bool AS covers_outbox,
    (p.puballtables OR EXISTS (
        SELECT 1 FROM pg_catalog.pg_publication_rel r
        WHERE r.prpubid = p.oid AND r.prrelid = to_regclass('ferry_migration_step')
    ))::bool AS covers_steps
FROM pg_catalog.pg_publication p
WHERE p.pubname = @pubname;
