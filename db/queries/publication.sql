-- name: PublicationGet :one
-- Whether the publication exists, publishes inserts and covers the outbox
-- table; and, for a partitioned outbox, whether it publishes the changes
-- of its partitions as the outbox's (the relay reads rows of a relation
-- named outbox, and would see none of a partition's). Creating it is DDL with an identifier, which a query parameter
-- cannot carry: relay/slot.go builds that statement itself.
-- (pg_catalog is spelled out: sqlc resolves these catalog relations only
-- when qualified.)
SELECT
    p.pubinsert,
    p.pubviaroot,
    coalesce((SELECT c.relkind = 'p' FROM pg_catalog.pg_class c WHERE c.oid = to_regclass('outbox')), false)::bool AS outbox_partitioned,
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
