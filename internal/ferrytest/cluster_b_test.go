package ferrytest_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// The stack's second cluster is another Kafka cluster, not another listener
// of the first: its cluster id differs, a topic made on one does not exist
// on the other, and a record produced to B is consumed from B.
func TestClusterBIsIndependent(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	admA, admB := ferrytest.Admin(t), ferrytest.AdminB(t)

	metaA, err := admA.BrokerMetadata(ctx)
	if err != nil {
		t.Fatalf("metadata of A: %v", err)
	}
	metaB, err := admB.BrokerMetadata(ctx)
	if err != nil {
		t.Fatalf("metadata of B: %v", err)
	}
	if metaA.Cluster == "" || metaA.Cluster == metaB.Cluster {
		t.Fatalf("cluster ids: A %q, B %q; want two different ones", metaA.Cluster, metaB.Cluster)
	}

	onA := ferrytest.Topic(t, 2)
	onB := ferrytest.TopicB(t, 2)
	// List every topic: a metadata request that names a missing topic may
	// create it (auto.create.topics.enable is on in both clusters).
	topicsA, err := admA.ListTopics(ctx)
	if err != nil {
		t.Fatalf("list topics of A: %v", err)
	}
	topicsB, err := admB.ListTopics(ctx)
	if err != nil {
		t.Fatalf("list topics of B: %v", err)
	}
	if !topicsA.Has(onA) || topicsB.Has(onA) {
		t.Fatalf("topic %s made on A: on A %v, on B %v; want only on A", onA, topicsA.Has(onA), topicsB.Has(onA))
	}
	if !topicsB.Has(onB) || topicsA.Has(onB) {
		t.Fatalf("topic %s made on B: on B %v, on A %v; want only on B", onB, topicsB.Has(onB), topicsA.Has(onB))
	}

	want := &kgo.Record{Topic: onB, Key: []byte("k"), Value: []byte("on B")}
	if err := ferrytest.ClientB(t).ProduceSync(ctx, want).FirstErr(); err != nil {
		t.Fatalf("produce to B: %v", err)
	}
	got := consumeOne(t, ferrytest.ClientB(t, kgo.ConsumeTopics(onB), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
	if string(got.Key) != "k" || string(got.Value) != "on B" {
		t.Fatalf("consumed %q=%q from B, want k=\"on B\"", got.Key, got.Value)
	}
}

// B's SASL_SSL listener takes the stack's CA and B's own SCRAM password.
func TestClusterBSASLSSL(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	secure := ferrytest.SecureB(t)
	topic := ferrytest.TopicB(t, 1)
	if err := secure.Client(t).ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatalf("produce to B over SASL_SSL as %s: %v", secure.User, err)
	}
}

// consumeOne returns the first record cl fetches; it fails the test after a
// minute without one.
func consumeOne(t *testing.T, cl *kgo.Client) *kgo.Record {
	t.Helper()
	ctx := ferrytest.Context(t, time.Minute)
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatal("no record consumed within a minute")
		}
		fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		if recs := fetches.Records(); len(recs) > 0 {
			return recs[0]
		}
	}
}
