package relay_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// A partitioned outbox is relayed like a plain one: the publication sends
// its partitions' rows as the outbox's, and every event reaches Kafka once,
// with its key and headers, in each aggregate's order.
func TestPartitionedOutboxPublishesEachEventOnce(t *testing.T) {
	t.Parallel()
	b := setupDB(t, ferrytest.NewPartitionedDB(t))
	topic := b.topic(t, "order", 3)
	b.start(t, b.cfg)
	var ids []string
	for i := range 20 {
		ids = append(ids, b.write(t, evt("order", fmt.Sprint(i%4), 2*i), evt("order", fmt.Sprint(i%4), 2*i+1))...)
	}
	c := consume(t, []string{topic}, ids, time.Minute, time.Second)
	if d := c.duplicates(); d != 0 || len(c.records) != len(ids) {
		t.Fatalf("%d records for %d events, %d duplicates; want each event once", len(c.records), len(ids), d)
	}
	for _, r := range c.records {
		if header(r, outbox.HeaderEventType) != "Changed" || header(r, outbox.HeaderAggregateID) != string(r.Key) ||
			header(r, "seq") == "" || !strings.Contains(string(r.Value), header(r, "seq")) {
			t.Fatalf("record %s: key %q, headers %v, value %s; want the aggregate id as key, event_type Changed and the row's seq header",
				header(r, outbox.HeaderID), r.Key, r.Headers, r.Value)
		}
	}
	c.checkFirstArrivalOrder(t)
}

// Retention of a partitioned outbox drops a partition only when its whole
// day is past the retention and the slot confirmed every row in it: not
// while no relay has published them (the partition stays, fenced against
// new rows, its rows readable), and never a partition whose day has not
// ended, however old its rows are by the retention.
func TestPartitionPruneDropsOnlyConfirmedExpiredPartitions(t *testing.T) {
	t.Parallel()
	b := setupDB(t, ferrytest.NewPartitionedDB(t))
	topic := b.topic(t, "order", 1)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -10)
	old := ferrytest.DayPartition(t, b.db, "outbox", day)
	insertOld := `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT gen_random_uuid(), 'order', 'old', 'Changed', '', $1 FROM generate_series(1, 5) RETURNING id::text`
	var ids []string
	rows, err := b.db.Pool.Query(b.ctx, insertOld, day.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	ids = append(ids, b.write(t, evt("order", "new", 1), evt("order", "new", 2))...)
	exists := func(name string) bool {
		var ok bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	count := func(where string) int {
		var n int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A retention shorter than what has passed of today: today's rows are
	// older than it, but today's partition has not ended.
	pc := relay.PruneConfig{Retention: time.Millisecond, ConfirmWait: 300 * time.Millisecond}

	// No relay has run: the slot confirmed none of them.
	res, err := relay.Prune(b.ctx, b.db.Pool, b.slot, &pc)
	if !errors.Is(err, relay.ErrUnconfirmed) || res == nil || res.PartitionsDropped != 0 || !res.Partitioned {
		t.Fatalf("Prune before the relay ran: %+v, %v; want nothing dropped and ErrUnconfirmed", res, err)
	}
	if !exists(old) || count("aggregate_id = 'old'") != 5 {
		t.Fatalf("after an unconfirmed prune, partition %s exists = %v with %d of its 5 rows; want it whole", old, exists(old), count("aggregate_id = 'old'"))
	}
	// The fence: no row enters a partition about to be dropped.
	if _, err := b.db.Pool.Exec(b.ctx, insertOld, day.Add(2*time.Hour)); err == nil || !strings.Contains(err.Error(), old+"_expired") {
		t.Fatalf("insert into the fenced partition %s: %v, want a check violation of %s_expired", old, err, old)
	}

	cfg := b.cfg
	p := pc
	p.Interval = 100 * time.Millisecond
	cfg.Prune = &p
	b.start(t, cfg)
	consume(t, []string{topic}, ids, time.Minute, 0)
	deadline := time.Now().Add(time.Minute)
	for exists(old) {
		if time.Now().After(deadline) {
			t.Fatalf("partition %s still exists a minute after the relay published its rows", old)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if today := "outbox_p" + time.Now().UTC().Format("20060102"); !exists(today) || count("aggregate_id = 'new'") != 2 {
		t.Fatalf("today's partition %s exists = %v with %d of its 2 rows; want it kept whole: its day has not ended", today, exists(today), count("aggregate_id = 'new'"))
	}
	if !exists("outbox_default") {
		t.Fatal("retention dropped the default partition")
	}
}

// A publication that would send a partitioned outbox's rows as its
// partitions' (which the relay does not read: every event would be
// skipped) is refused under NoCreate with the statement that fixes it, and
// fixed by Setup otherwise.
func TestSetupPublishesAPartitionedOutboxAsTheOutbox(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewPartitionedDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE PUBLICATION leafs FOR TABLE outbox, ferry_migration_step WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	slot := "ferry_" + ferrytest.Suffix()
	cfg := relay.Config{DatabaseURL: db.URL, Slot: slot, Publication: "leafs", NoCreate: true,
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(ferrytest.Brokers(t)...)}}
	r, err := relay.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(ctx)
	if !errors.Is(err, relay.ErrPublicationMissing) || !strings.Contains(err.Error(), "publish_via_partition_root = true") {
		t.Fatalf("relay on a publication without publish_via_partition_root and NoCreate: %v, want ErrPublicationMissing with the fix", err)
	}
	if err := relay.Setup(ctx, db.Pool, slot, "leafs", nil); err != nil {
		t.Fatal(err)
	}
	var viaRoot bool
	if err := db.Pool.QueryRow(ctx, `SELECT pubviaroot FROM pg_publication WHERE pubname = 'leafs'`).Scan(&viaRoot); err != nil || !viaRoot {
		t.Fatalf("after Setup the publication's publish_via_partition_root is %v (%v), want true", viaRoot, err)
	}
}
