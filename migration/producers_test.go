package migration_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// produce writes recs through cl and fails the test on any error.
func produce(t *testing.T, ctx context.Context, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// The old channel's producers in a window, on the real cluster A: two
// idempotent producers count as two distinct ids, with what each wrote; a
// non-idempotent one has no id and counts as unknown; a record whose
// timestamp is before the window is not counted, at the start of a
// partition or in its middle, and counts once the window covers it. The
// topics come from the plan group's committed offsets, less a dead-letter
// topic and a topic the new channel's template claims on the same
// cluster; a partition that ends with a transaction marker is read to its
// end; a topic named that does not exist says so.
func TestProducersCountsDistinctProducersInTheWindow(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	orders, payments := ferrytest.Topic(t, 2), ferrytest.Topic(t, 1)
	dlq, moved := orders+".dlq", orders+".v2"
	ferrytest.CreateTopic(t, dlq, 1)
	ferrytest.CreateTopic(t, moved, 1)
	group := ferrytest.Name(t, "g")
	plan := migration.Plan{Name: "move-1", Groups: []string{group},
		Old: migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "t.{aggregate_type}"},
		New: migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "{aggregate_type}.v2"}}

	now := time.Now()
	a, b := ferrytest.Client(t), ferrytest.Client(t)
	anon := ferrytest.Client(t, kgo.DisableIdempotentWrite())
	rec := func(key string, age time.Duration, headers ...kgo.RecordHeader) *kgo.Record {
		r := &kgo.Record{Topic: orders, Key: []byte(key), Value: []byte("v"), Headers: headers}
		if age > 0 {
			r.Timestamp = now.Add(-age)
		}
		return r
	}
	stamp := kgo.RecordHeader{Key: route.HeaderRoute, Value: []byte("plan=move-1;epoch=1;slice=3;side=old;role=authoritative;since=0;peer=")}
	produce(t, ctx, a, rec("k1", 48*time.Hour), rec("k2", 48*time.Hour)) // before the window, first in their partitions
	produce(t, ctx, a, rec("k1", 0), rec("k2", 0), rec("k3", 0), rec("k1", 0, stamp))
	produce(t, ctx, b, rec("k2", 0))
	produce(t, ctx, b, rec("k1", 30*time.Hour), rec("k2", 30*time.Hour)) // before the window, after records in it
	produce(t, ctx, anon, rec("k1", 0), rec("k3", 0))
	produce(t, ctx, ferrytest.Client(t), &kgo.Record{Topic: dlq, Value: []byte("dead")})
	produce(t, ctx, ferrytest.Client(t), &kgo.Record{Topic: moved, Value: []byte("new channel")})

	txn := ferrytest.Client(t, kgo.TransactionalID(ferrytest.Name(t, "txn")))
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produce(t, ctx, txn, &kgo.Record{Topic: payments, Value: []byte("1")}, &kgo.Record{Topic: payments, Value: []byte("2")})
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	offsets := kadm.Offsets{}
	for _, topic := range []string{orders, payments, dlq, moved} {
		offsets.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1, LeaderEpoch: -1})
	}
	if err := ferrytest.Admin(t).CommitAllOffsets(ctx, group, offsets); err != nil {
		t.Fatal(err)
	}

	res, err := migration.Producers(ctx, plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := topicNames(res); !slices.Equal(got, sortedPair(orders, payments)) || !slices.Equal(res.Groups, []string{group}) {
		t.Fatalf("topics read %v from groups %v; want %s and %s from %s", got, res.Groups, orders, payments, group)
	}
	if w := res.Until.Sub(res.Since); w < migration.ProducersWindowDefault || w > migration.ProducersWindowDefault+time.Minute {
		t.Fatalf("window %s .. %s, want the last 24h", res.Since, res.Until)
	}
	o := topicOf(t, res, orders)
	if len(o.Producers) != 2 || o.Records != 7 || o.Unknown.ID != migration.UnknownProducer || o.Unknown.Records != 2 {
		t.Fatalf("%s: %+v; want 2 distinct producers, 7 records, 2 of them from unknown producers", orders, o)
	}
	pa, pb := o.Producers[0], o.Producers[1]
	if pa.Records == 1 {
		pa, pb = pb, pa
	}
	if pa.ID == pb.ID || pa.ID < 0 || pb.ID < 0 || pa.Records != 4 || pa.Stamped != 1 || pb.Records != 1 || pb.Stamped != 0 {
		t.Fatalf("%s producers %+v; want a's 4 records (1 stamped) and b's 1, under two ids", orders, o.Producers)
	}
	for _, p := range append(o.Producers, o.Unknown) {
		if p.FirstSeen.Before(res.Since) || p.LastSeen.Before(p.FirstSeen) || p.LastSeen.After(time.Now()) {
			t.Fatalf("%s producer %+v: first and last seen outside the window %s .. now", orders, p, res.Since)
		}
	}
	if p := topicOf(t, res, payments); len(p.Producers) != 1 || p.Records != 2 || p.Unknown.Records != 0 {
		t.Fatalf("%s (transactional, ending in a commit marker): %+v; want 1 producer, 2 records", payments, p)
	}

	nope := "t.nope." + ferrytest.Suffix()
	res, err = migration.Producers(ctx, plan, &migration.ProducersOpts{Topics: []string{orders, nope}, Window: 72 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if o := topicOf(t, res, orders); len(o.Producers) != 2 || o.Records != 11 || o.Unknown.Records != 2 || o.Missing || res.Groups != nil {
		t.Fatalf("%s over 72h: %+v (groups %v); want the 4 older records counted too, no group asked", orders, o, res.Groups)
	}
	if n := topicOf(t, res, nope); len(res.Topics) != 2 || !n.Missing || n.Records != 0 {
		t.Fatalf("a topic that does not exist: %+v; want it marked missing", res.Topics)
	}
}

// Without a group's commits there is no topic to read, and that is no
// error; an old channel whose SASL password variable is unset is one,
// naming the variable.
func TestProducersWithoutTopicsOrCredentials(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	plan := migration.Plan{Name: "move-1", Groups: []string{ferrytest.Name(t, "g")},
		Old: migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "t.{aggregate_type}"},
		New: migration.Channel{Brokers: []string{"b:9092"}, TopicTemplate: "t.{aggregate_type}"}}
	res, err := migration.Producers(ctx, plan, nil)
	if err != nil || len(res.Topics) != 0 {
		t.Fatalf("a group that committed nothing: %+v, %v; want no topic and no error", res, err)
	}
	plan.Old.SASLMechanism, plan.Old.SASLUsername, plan.Old.SASLPasswordEnv = "PLAIN", "ferry", "OLD_PASS"
	_, err = migration.Producers(ctx, plan, &migration.ProducersOpts{Getenv: func(string) string { return "" }})
	if err == nil || !strings.Contains(err.Error(), "OLD_PASS") {
		t.Fatalf("no password: %v; want an error naming OLD_PASS", err)
	}
}

func topicNames(res *migration.ProducersResult) []string {
	var out []string
	for _, tp := range res.Topics {
		out = append(out, tp.Topic)
	}
	return out
}

func topicOf(t *testing.T, res *migration.ProducersResult, topic string) migration.TopicProducers {
	t.Helper()
	for _, tp := range res.Topics {
		if tp.Topic == topic {
			return tp
		}
	}
	t.Fatalf("topic %s not read: %v", topic, topicNames(res))
	return migration.TopicProducers{}
}

func sortedPair(a, b string) []string {
	if b < a {
		return []string{b, a}
	}
	return []string{a, b}
}
