package workercli_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// migration quarantine list shows the events of a live migration never
// applied, escaped; replay wants a selection, publishes the event back to
// the topic and partition of its shadow copy, with its id and without the
// route stamp, and empties the quarantine.
func TestMigrationQuarantineCommands(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	topic := ferrytest.Topic(t, 2)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ferry_inbox_quarantine (consumer, message_id, plan, side, topic, partition,
		record_offset, record_key, record_value, record_headers, reason, received_at)
		VALUES ('billing', 'm-`+"\x1b]0;pwned\x07"+`', 'move', 'old', $1, 1, 41, 'k', 'v',
		'[{"k":"id","v":"bS0x"},{"k":"ferry.route","v":"eA=="}]', 'the authoritative copy was never applied', now())`, topic); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(ctx, nil, "migration", "quarantine", "list", "--database-url", db.URL)
	if code != 0 || !strings.Contains(stdout, "old "+topic+"/1/41") || !strings.Contains(stdout, "1 quarantined events") ||
		strings.ContainsAny(stdout, "\x1b\x07") {
		t.Fatalf("migration quarantine list: exit %d\n%q\n%s", code, stdout, stderr)
	}
	code, _, stderr = run(ctx, nil, "migration", "quarantine", "replay", "--database-url", db.URL)
	if code != 2 || !strings.Contains(stderr, "--all") {
		t.Fatalf("migration quarantine replay without a selection: exit %d, want 2 naming --all\n%s", code, stderr)
	}
	code, stdout, stderr = run(ctx, nil, "migration", "quarantine", "replay", "--consumer", "billing",
		"--database-url", db.URL, "--kafka-brokers", strings.Join(ferrytest.Brokers(t), ","))
	if code != 0 || !strings.Contains(stdout, "1 replayed") {
		t.Fatalf("migration quarantine replay: exit %d\n%s\n%s", code, stdout, stderr)
	}
	cl := ferrytest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got *kgo.Record
	for got == nil && pctx.Err() == nil {
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got = r })
	}
	if got == nil || got.Partition != 1 || string(got.Key) != "k" || string(got.Value) != "v" {
		t.Fatalf("replayed record %+v, want k=v on partition 1", got)
	}
	var id string
	for _, h := range got.Headers {
		if h.Key == "ferry.route" {
			t.Fatalf("the replayed record keeps its route stamp: %v", got.Headers)
		}
		if h.Key == "id" {
			id = string(h.Value)
		}
	}
	if id != "m-1" {
		t.Fatalf("replayed record's id %q, want m-1 (its original)", id)
	}
	if n := count(t, db, `SELECT count(*) FROM ferry_inbox_quarantine`); n != 0 {
		t.Fatalf("%d events still quarantined after the replay", n)
	}
}

func count(t *testing.T, db *ferrytest.DB, q string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// quarantine inserts an entry of consumer billing in plan move, from side,
// quarantined at the given second of a fixed day (the order replay takes).
func quarantine(t *testing.T, db *ferrytest.DB, id, side, topic string, second int) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO ferry_inbox_quarantine (consumer, message_id, plan, side,
		topic, partition, record_offset, record_key, record_value, record_headers, reason, received_at, quarantined_at)
		VALUES ('billing', $1, 'move', $2, $3, 0, 7, 'k', 'v', '[]', 'the authoritative copy was never applied',
		'2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'::timestamptz + make_interval(secs => $4))`, id, side, topic, second); err != nil {
		t.Fatal(err)
	}
}

// An event that left the quarantine while the replay ran (the worker
// applied its authoritative copy meanwhile) needs no replay: the replay
// says so, does not fail on it, even when it could not have reached its
// channel, and exits 0. An event it could not replay is named, the others
// are replayed all the same, and the replay exits 1.
func TestMigrationQuarantineReplayCountsEventsAppliedMeanwhileAsDone(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	topic := ferrytest.Topic(t, 1)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	// The new channel as consumer billing learned it: behind SCRAM, with a
	// password variable this process does not have.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ferry_inbox_channel (consumer, plan, side, topic, peer, channel)
		VALUES ('billing', 'move', 'old', $1, 'p', $2)`, topic, `{"brokers":["127.0.0.1:1"],"topic_template":"t.{aggregate_type}",
		"sasl_mechanism":"SCRAM-SHA-512","sasl_username":"ferry","sasl_password_env":"FERRY_TEST_NO_SUCH_PASSWORD_VARIABLE"}`); err != nil {
		t.Fatal(err)
	}
	// The worker applies m-2 (and drops its entry) while m-1 is replayed:
	// a trigger stands in for it.
	if _, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION applied_meanwhile() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO inbox (consumer, message_id) VALUES ('billing', 'm-2');
			DELETE FROM ferry_inbox_quarantine WHERE consumer = 'billing' AND message_id = 'm-2';
			RETURN NULL;
		END $$;
		CREATE TRIGGER applied_meanwhile AFTER DELETE ON ferry_inbox_quarantine
			FOR EACH ROW WHEN (OLD.message_id = 'm-1') EXECUTE FUNCTION applied_meanwhile();`); err != nil {
		t.Fatal(err)
	}
	quarantine(t, db, "m-1", "old", topic, 1)
	quarantine(t, db, "m-2", "new", "t.order", 2)
	code, stdout, stderr := run(ctx, nil, "migration", "quarantine", "replay", "--all", "--database-url", db.URL, "--kafka-brokers", brokers)
	if code != 0 || !strings.Contains(stdout, "replayed m-1 of billing") ||
		!strings.Contains(stdout, "m-2 of billing: no longer quarantined") ||
		!strings.Contains(stdout, "1 replayed, 1 no longer quarantined, 0 failed") {
		t.Fatalf("replay --all with m-2 applied meanwhile: exit %d, want 0 with m-1 replayed and m-2 no longer quarantined\n%s%s",
			code, stdout, stderr)
	}

	// m-3 is still quarantined, and its channel cannot be reached from
	// here; m-4, after it, is replayed all the same.
	quarantine(t, db, "m-3", "new", "t.order", 3)
	quarantine(t, db, "m-4", "old", topic, 4)
	code, stdout, stderr = run(ctx, nil, "migration", "quarantine", "replay", "--all", "--database-url", db.URL, "--kafka-brokers", brokers)
	if code != 1 || !strings.Contains(stdout, "m-3 of billing: not replayed: ") || !strings.Contains(stdout, "FERRY_TEST_NO_SUCH_PASSWORD_VARIABLE") ||
		!strings.Contains(stdout, "replayed m-4 of billing") || !strings.Contains(stdout, "1 replayed, 0 no longer quarantined, 1 failed") ||
		!strings.Contains(stderr, "1 of 2 quarantined events not replayed") {
		t.Fatalf("replay --all with m-3 unreachable: exit %d, want 1 naming m-3, with m-4 replayed\n%s%s", code, stdout, stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM ferry_inbox_quarantine`); n != 1 {
		t.Fatalf("%d events quarantined after the replays, want 1 (m-3)", n)
	}
}

// A quarantined shadow that came from a RabbitMQ channel goes back to the
// consumer's own shard queue there, with its id and without the route
// stamp: from the old channel through --rabbitmq-url, from the new one
// through the RabbitMQ channel the consumer learned (its password from the
// variable the plan names).
func TestMigrationQuarantineReplayToRabbitMQ(t *testing.T) {
	url := rabbitEnv(t, "FERRY_TEST_RABBITMQ_URL")
	t.Setenv("FERRY_RABBITMQ_PASSWORD", rabbitEnv(t, "FERRY_TEST_RABBITMQ_PASSWORD"))
	t.Setenv("FERRY_TEST_PLAN_RABBITMQ_PASSWORD", rabbitEnv(t, "FERRY_TEST_RABBITMQ_PASSWORD"))
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	oldEx, newEx := "outbox.event."+ferrytest.Name(t, "old"), "outbox.event."+ferrytest.Name(t, "new")
	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []string{oldEx, newEx} {
		if err := rabbitmq.Declare(ch, &rabbitmq.Topology{Consumer: "billing", Topics: []string{ex}, Shards: 4}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteRabbitTopology(t, ex, "billing", 4) })
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ferry_inbox_channel (consumer, plan, side, topic, peer, channel)
		VALUES ('billing', 'move', 'old', 'outbox.event.order', $1, $2)`, newEx,
		`{"kind":"rabbitmq","url":"`+url+`","password_env":"FERRY_TEST_PLAN_RABBITMQ_PASSWORD","topic_template":"t.{aggregate_type}","shards":4}`); err != nil {
		t.Fatal(err)
	}
	for i, q := range []struct{ id, side, topic string }{{"r-1", "old", oldEx}, {"r-2", "new", newEx}} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO ferry_inbox_quarantine (consumer, message_id, plan, side, topic, partition,
			record_offset, record_key, record_value, record_headers, reason, received_at)
			VALUES ('billing', $1, 'move', $2, $3, 3, $4, 'k', 'v', $5, 'the authoritative copy was never applied', now())`,
			q.id, q.side, q.topic, i, `[{"k":"id","v":"`+base64.StdEncoding.EncodeToString([]byte(q.id))+`"},{"k":"ferry.route","v":"eA=="}]`); err != nil {
			t.Fatal(err)
		}
	}
	code, stdout, stderr := run(ctx, nil, "migration", "quarantine", "replay", "--all", "--database-url", db.URL, "--rabbitmq-url", url)
	if code != 0 || !strings.Contains(stdout, "2 replayed, 0 no longer quarantined, 0 failed") {
		t.Fatalf("migration quarantine replay --rabbitmq-url: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, q := range []struct{ id, topic string }{{"r-1", oldEx}, {"r-2", newEx}} {
		queue := rabbitmq.QueueName(q.topic, 3, "billing")
		deliveries, err := ch.Consume(queue, "", true, false, false, false, nil) // a single active consumer's queue takes no basic.get
		if err != nil {
			t.Fatal(err)
		}
		var d amqp.Delivery
		select {
		case d = <-deliveries:
		case <-ctx.Done():
			t.Fatalf("%s: nothing in %s; want it replayed there", q.id, queue)
		}
		if d.MessageId != q.id || string(d.Body) != "v" || d.Headers[outbox.HeaderAggregateID] != "k" {
			t.Fatalf("replayed %s: message id %q, body %q, headers %v", q.id, d.MessageId, d.Body, d.Headers)
		}
		if _, stamped := d.Headers["ferry.route"]; stamped {
			t.Fatalf("replayed %s keeps its route stamp: %v", q.id, d.Headers)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM ferry_inbox_quarantine`); n != 0 {
		t.Fatalf("%d events still quarantined after the replay", n)
	}
}

// deleteRabbitTopology deletes what rabbitmq.Declare made for consumer on
// topic.
func deleteRabbitTopology(t *testing.T, topic, consumer string, shards int) {
	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for s := range shards {
		_, _ = ch.QueueDelete(rabbitmq.QueueName(topic, s, consumer), false, false, false)
	}
	_, _ = ch.QueueDelete(topic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
	_ = ch.ExchangeDelete(topic+rabbitmq.DeadLetterExchangeSuffix, false, false)
	_ = ch.ExchangeDelete(topic, false, false)
}
