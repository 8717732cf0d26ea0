package schema

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferryhq/ferry/internal/partition"
)

// Partitioning is a layout of a table retention empties by time.
type Partitioning string

// PartitionDaily partitions a table by UTC day: retention drops a day's
// partition whole instead of deleting its rows one by one.
const PartitionDaily Partitioning = "daily"

// ErrNotEmpty is returned, wrapped, by PartitionOutbox and PartitionInbox
// for a table that holds rows: Ferry converts only an empty table, and
// changes nothing.
var ErrNotEmpty = partition.ErrNotEmpty

// PartitionOutbox lays the outbox out as a table partitioned by day on
// created_at, once Ferry's migrations are applied (Up) and before the
// first event: the outbox must be empty, or nothing changes and the error
// wraps ErrNotEmpty. An outbox already partitioned is left as it is. The new
// table keeps the columns, defaults, constraints and other roles'
// privileges, every publication that named the outbox names the new one
// with publish_via_partition_root, and it gets a default partition (for a
// created_at set by hand outside every partition; never dropped by
// retention) and the partitions of today and the next partition.Ahead
// days. From then on the relay's retention (relay.Prune) creates the
// partitions ahead and drops a day's partition once its whole day is
// older than the retention and the slot confirmed every row in it; the
// role that runs it must own the outbox.
//
// db must have been opened with the pgx driver (sql.Open("pgx", url) or
// stdlib.OpenDBFromPool).
func PartitionOutbox(ctx context.Context, db *sql.DB, p Partitioning) error {
	return partitionTable(ctx, db, partition.Outbox, p)
}

// PartitionInbox lays the inbox out as a table partitioned by day on
// processed_at, as PartitionOutbox does the outbox (the same conditions,
// the same refusal). Its primary key becomes (consumer, message_id,
// processed_at), so the worker no longer claims a message with ON
// CONFLICT, which would not see a claim in another day's partition: it
// locks the (consumer, message id) for its transaction and then inserts
// the claim only if no partition holds it, which keeps every message
// applied once per consumer; it needs the worker's transactions to be READ
// COMMITTED (the default), and checks. Worker retention (inbox.Prune) then
// creates the partitions ahead and drops a day's partition once the whole
// day is older than the retention, or than the longest dedupe window of a
// live migration of any consumer sharing the table, whichever is longer.
func PartitionInbox(ctx context.Context, db *sql.DB, p Partitioning) error {
	return partitionTable(ctx, db, partition.Inbox, p)
}

func partitionTable(ctx context.Context, db *sql.DB, t partition.Table, p Partitioning) error {
	if p != PartitionDaily {
		return fmt.Errorf("migrate: partitioning %q: want %q", p, PartitionDaily)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: partition the %s: %w", t.Name, err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("the database was not opened with the pgx driver (%T)", dc)
		}
		return partition.Convert(ctx, c.Conn(), t, time.Now())
	})
	if err != nil {
		return fmt.Errorf("migrate: partition the %s: %w", t.Name, err)
	}
	return nil
}
