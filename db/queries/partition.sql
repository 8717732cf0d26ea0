-- Time-partitioned outbox and inbox (internal/partition). The DDL that
-- creates, fences and drops partitions names tables, which a query
-- parameter cannot carry: internal/partition builds those statements. What
-- reads the catalog is here. (pg_catalog is spelled out: sqlc resolves
-- these catalog relations only when qualified.)

-- name: PartitionIsPartitioned :one
-- Whether the table is partitioned; false when it does not exist.
SELECT coalesce((
    SELECT c.relkind = 'p' FROM pg_catalog.pg_class c WHERE c.oid = to_regclass(@name::text)
), false)::bool AS partitioned;

-- name: PartitionList :many
-- The partitions of a table bounded on both sides, oldest first, with their
-- bounds cast back from the text PostgreSQL prints them as, and whether
-- retention fenced them (a constraint named <partition>_expired). The
-- default partition, and any with MINVALUE or MAXVALUE, are not listed:
-- retention never drops them.
WITH p AS (
    SELECT c.oid, c.relname, pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound
    FROM pg_catalog.pg_inherits i
    JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass(@parent::text)
)
SELECT
    p.relname::text AS name,
    substring(p.bound FROM 'FROM \(''([^'']+)''\)')::timestamptz AS range_from,
    substring(p.bound FROM 'TO \(''([^'']+)''\)')::timestamptz AS range_to,
    EXISTS (
        SELECT 1 FROM pg_catalog.pg_constraint k
        WHERE k.conrelid = p.oid AND k.conname = p.relname || '_expired'
    )::bool AS fenced
FROM p
WHERE p.bound ~ '^FOR VALUES FROM \(''[^'']+''\) TO \(''[^'']+''\)$'
ORDER BY range_to;

-- name: PartitionPublications :many
-- The publications that name the table, to name the partitioned table
-- that replaces it.
SELECT p.pubname::text AS pubname
FROM pg_catalog.pg_publication p
JOIN pg_catalog.pg_publication_rel r ON r.prpubid = p.oid
WHERE r.prrelid = to_regclass(@name::text)
ORDER BY p.pubname;

-- name: PartitionGrants :many
-- The privileges other roles hold on the table, to grant them again on the
-- partitioned table that replaces it.
SELECT
    coalesce((SELECT g.rolname FROM pg_catalog.pg_roles g WHERE g.oid = a.grantee), 'PUBLIC')::text AS grantee,
    a.privilege_type::text AS privilege
FROM pg_catalog.pg_class c
CROSS JOIN LATERAL aclexplode(c.relacl) a
WHERE c.oid = to_regclass(@name::text) AND a.grantee <> c.relowner
ORDER BY 1, 2;

-- name: WALInsertLSN :one
-- The WAL insert position: every transaction that committed before this
-- statement wrote its commit record below it.
SELECT pg_current_wal_insert_lsn()::text AS lsn;
