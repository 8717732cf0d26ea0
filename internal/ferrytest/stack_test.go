package ferrytest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// The broker the stack started is a real Kafka: a topic can be created, and a
// record produced with acks=all comes back to a consumer intact.
func TestKafkaRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	topic := ferrytest.Topic(t, 3)

	producer := ferrytest.Client(t)
	want := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("hello"), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("1")}}}
	if err := producer.ProduceSync(ctx, want).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	consumer := ferrytest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatal("no record consumed within a minute")
		}
		fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		var got *kgo.Record
		fetches.EachRecord(func(r *kgo.Record) { got = r })
		if got == nil {
			continue
		}
		if string(got.Key) != "k" || string(got.Value) != "hello" || len(got.Headers) != 1 || string(got.Headers[0].Value) != "1" {
			t.Fatalf("consumed %q=%q headers %v, want k=hello with id=1", got.Key, got.Value, got.Headers)
		}
		return
	}
}

// PostgreSQL runs with wal_level=logical, and a pgoutput slot on a
// publication of outbox sees a row the writer inserted.
func TestLogicalReplicationSeesOutboxInsert(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE PUBLICATION stack_test FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	slot := "stack_test_" + ferrytest.Suffix()
	if _, err := db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	ids, err := outbox.Write(ctx, db.Pool, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "Placed", Payload: []byte("p")})
	if err != nil {
		t.Fatal(err)
	}

	cfg, err := pgconn.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'stack_test'"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var relationName string
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("no insert received: %v", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			relationName = m.RelationName
			if m.Columns[0].Name != "id" {
				t.Fatalf("first column %q, want id", m.Columns[0].Name)
			}
		case *pglogrepl.InsertMessage:
			if relationName != "outbox" {
				t.Fatalf("insert into %q, want outbox", relationName)
			}
			if got := string(m.Tuple.Columns[0].Data); got != ids[0].String() {
				t.Fatalf("replicated id %s, want %s", got, ids[0])
			}
			return
		}
	}
}
