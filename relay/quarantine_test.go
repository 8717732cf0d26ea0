package relay_test

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/relay"
)

func quarantine(t *testing.T, b *bundle) []relay.QuarantinedEvent {
	t.Helper()
	rows, err := relay.ListQuarantined(b.ctx, b.db.Pool, 100)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func waitQuarantined(t *testing.T, b *bundle, n int) []relay.QuarantinedEvent {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rows := quarantine(t, b)
		if len(rows) >= n {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events quarantined after a minute, want %d", len(rows), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A payload larger than the topic accepts is quarantined with its reason,
// and the events after it are still published.
func TestOversizedPayloadIsQuarantined(t *testing.T) {
	t.Parallel()
	b := setup(t)
	limit := "2048"
	topic := b.prefix + ".blob"
	ferrytest.CreateTopicConfig(t, topic, 1, map[string]*string{"max.message.bytes": &limit})
	r := b.start(t, b.cfg)

	before := b.write(t, evt("blob", "a", 1))
	big := evt("blob", "a", 2)
	big.Payload = make([]byte, 10_000)
	_, _ = rand.Read(big.Payload) // incompressible: the broker sees all of it
	bigID := b.write(t, big)[0]
	after := b.write(t, evt("blob", "a", 3), evt("blob", "b", 1))

	c := consume(t, []string{topic}, append(before, after...), time.Minute, 500*time.Millisecond)
	if c.byID[bigID] != 0 {
		t.Fatal("oversized event reached Kafka")
	}
	rows := waitQuarantined(t, b, 1)
	q := rows[0]
	if q.ID.String() != bigID || q.Reason != relay.ReasonMessageTooLarge || q.Topic != topic ||
		!bytes.Equal(q.Payload, big.Payload) || q.AggregateType != "blob" || q.AggregateID != "a" ||
		q.EventType != big.EventType || q.Headers["seq"] != "2" || len(q.Headers) != 1 ||
		!strings.Contains(q.Error, "MESSAGE_TOO_LARGE") || q.CommitLSN == "" ||
		q.CreatedAt.IsZero() || q.QuarantinedAt.Before(q.CreatedAt) {
		t.Fatalf("relay.ListQuarantined = %+v, want id %s reason %s topic %s with the event's fields, error text, commit LSN and times",
			q, bigID, relay.ReasonMessageTooLarge, topic)
	}
	if st, err := relay.Status(b.ctx, b.db.Pool, b.slot); err != nil || st.Quarantined != 1 || !st.Exists {
		t.Fatalf("relay.Status = %+v, %v; want the slot and 1 quarantined", st, err)
	}
	if st := r.Stats(); st.Quarantined != 1 || st.Published < 3 {
		t.Fatalf("stats %+v, want 1 quarantined and at least 3 published", st)
	}
}

// An aggregate type that makes an invalid topic name is quarantined without
// stalling the others.
func TestInvalidTopicIsQuarantined(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	b.start(t, b.cfg)

	bad := evt("no spaces allowed", "x", 1)
	badID := b.write(t, bad)[0]
	good := b.write(t, evt("order", "o", 1))
	consume(t, []string{topic}, good, time.Minute, 0)
	rows := waitQuarantined(t, b, 1)
	if rows[0].ID.String() != badID || rows[0].Reason != relay.ReasonInvalidTopic {
		t.Fatalf("quarantine row %+v, want %s with reason %s", rows[0], badID, relay.ReasonInvalidTopic)
	}
	// The slot's confirmed position moves past the quarantined event: it
	// does not stall the relay.
	waitConfirmedPast(t, b, rows[0].CommitLSN)
}

func waitConfirmedPast(t *testing.T, b *bundle, lsn string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var past bool
		err := b.db.Pool.QueryRow(b.ctx, `SELECT confirmed_flush_lsn > $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, b.slot, lsn).Scan(&past)
		if err != nil {
			t.Fatal(err)
		}
		if past {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %s not confirmed past %s after 30s", b.slot, lsn)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Once the cause is fixed (the topic's limit raised), requeued events are
// published with their original ids and leave the quarantine.
func TestRequeueAfterFixPublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	limit := "2048"
	topic := b.prefix + ".blob"
	ferrytest.CreateTopicConfig(t, topic, 1, map[string]*string{"max.message.bytes": &limit})
	b.cfg.TopicConfigRefresh = 100 * time.Millisecond
	b.start(t, b.cfg)

	big := evt("blob", "a", 1)
	big.Payload = make([]byte, 10_000)
	_, _ = rand.Read(big.Payload)
	bigID := b.write(t, big)[0]
	waitQuarantined(t, b, 1)

	raised := "1048576"
	adm := ferrytest.Admin(t)
	res, err := adm.AlterTopicConfigs(b.ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &raised}}, topic)
	if err == nil {
		_, err = res.On(topic, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	n, err := relay.Requeue(b.ctx, b.db.Pool, nil)
	if err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}
	c := consume(t, []string{topic}, []string{bigID}, time.Minute, 0)
	if got := c.records[0].Value; !bytes.Equal(got, big.Payload) {
		t.Fatalf("requeued record value differs (%d bytes)", len(got))
	}
	if rows := quarantine(t, b); len(rows) != 0 {
		t.Fatalf("%d events still quarantined after a successful requeue", len(rows))
	}
}
