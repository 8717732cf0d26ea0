package schema_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/schema"
)

// A table holding a row is not converted: the error says why, and the
// table and its row are as they were.
func TestPartitionRefusesANonEmptyTable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		table, insert string
		partition     func(context.Context, *sql.DB, schema.Partitioning) error
	}{
		{"outbox", `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (gen_random_uuid(), 'order', '1', 'Placed', '')`, schema.PartitionOutbox},
		{"inbox", `INSERT INTO inbox (consumer, message_id) VALUES ('c', 'm')`, schema.PartitionInbox},
	} {
		t.Run(tc.table, func(t *testing.T) {
			t.Parallel()
			ctx := ferrytest.Context(t, time.Minute)
			d := ferrytest.NewMigratedDB(t)
			if _, err := d.Pool.Exec(ctx, tc.insert); err != nil {
				t.Fatal(err)
			}
			err := tc.partition(ctx, d.SQL(t), schema.PartitionDaily)
			if !errors.Is(err, schema.ErrNotEmpty) || !strings.Contains(err.Error(), tc.table+" holds rows") {
				t.Fatalf("partitioning an %s with a row: %v, want ErrNotEmpty saying it holds rows", tc.table, err)
			}
			var kind string
			var rows int
			if err := d.Pool.QueryRow(ctx, `SELECT relkind::text, (SELECT count(*) FROM `+tc.table+`) FROM pg_class WHERE oid = $1::regclass`,
				tc.table).Scan(&kind, &rows); err != nil {
				t.Fatal(err)
			}
			if kind != "r" || rows != 1 {
				t.Fatalf("after the refusal the %s has relkind %q and %d rows, want a plain table (r) with its 1 row", tc.table, kind, rows)
			}
			if err := tc.partition(ctx, d.SQL(t), "weekly"); err == nil || !strings.Contains(err.Error(), `"weekly"`) {
				t.Fatalf("partitioning weekly: %v, want a refusal naming it", err)
			}
		})
	}
}

// An empty outbox becomes partitioned by day and keeps what the
// migrations and an administrator gave it: its constraints, the privileges
// of other roles, its place in publications (publishing as the outbox),
// plus a default partition and a week of partitions ahead. Converting
// again changes nothing.
func TestPartitionOutboxKeepsTheTable(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	d := ferrytest.NewMigratedDB(t)
	role := "ferry_part_" + ferrytest.Suffix()
	for _, s := range []string{
		`CREATE ROLE ` + role,
		`GRANT SELECT, DELETE ON outbox TO ` + role,
		`CREATE PUBLICATION part_pub FOR TABLE outbox WITH (publish = 'insert')`,
	} {
		if _, err := d.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() { _, _ = d.Pool.Exec(ctx, `DROP OWNED BY `+role+`; DROP ROLE `+role) })
	for range 2 {
		if err := schema.PartitionOutbox(ctx, d.SQL(t), schema.PartitionDaily); err != nil {
			t.Fatal(err)
		}
	}
	var kind string
	var parts int
	var defaultPart, viaRoot, inPub, canDelete bool
	err := d.Pool.QueryRow(ctx, `SELECT
		(SELECT relkind::text FROM pg_class WHERE oid = 'outbox'::regclass),
		(SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass),
		to_regclass('outbox_default') IS NOT NULL,
		(SELECT pubviaroot FROM pg_publication WHERE pubname = 'part_pub'),
		EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
		        WHERE p.pubname = 'part_pub' AND r.prrelid = 'outbox'::regclass),
		has_table_privilege($1, 'outbox', 'DELETE')`, role).Scan(&kind, &parts, &defaultPart, &viaRoot, &inPub, &canDelete)
	if err != nil {
		t.Fatal(err)
	}
	if kind != "p" || parts != 1+8 || !defaultPart || !viaRoot || !inPub || !canDelete {
		t.Fatalf("after PartitionOutbox: relkind %q, %d partitions, default %v, publication via root %v and naming it %v, role may delete %v; "+
			"want p, the default and 8 days, and everything true", kind, parts, defaultPart, viaRoot, inPub, canDelete)
	}
	// The reserved-header constraint of migration 00003 still holds.
	_, err = d.Pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES (gen_random_uuid(), 'order', '1', 'Placed', '', '{"id": "forged"}')`)
	if err == nil || !strings.Contains(err.Error(), "outbox_headers_not_reserved") {
		t.Fatalf("insert with a reserved header into the partitioned outbox: %v, want outbox_headers_not_reserved to refuse it", err)
	}
	// Today's row lands in today's partition.
	var part string
	if err := d.Pool.QueryRow(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES (gen_random_uuid(), 'order', '1', 'Placed', '') RETURNING tableoid::regclass::text`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	if want := "outbox_p" + time.Now().UTC().Format("20060102"); part != want {
		t.Fatalf("a row written now went to %s, want %s", part, want)
	}
}
