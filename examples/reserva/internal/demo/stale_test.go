package demo

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// staleEvents are what an earlier demo can leave unconsumed on the demo's
// topics or queues (a run interrupted with a backlog, or its relay's
// republished copies after its workers stopped): an OrderPlaced and a
// StockReserved of an order the next run's database does not have. Applied
// in that database, the first takes stock for no order and the second
// retries until it is dead-lettered. make test saw it: the Kafka demo
// counted 211 dead-lettered messages instead of its malformed ones, with
// p50 order latency 54 s.
func staleEvents(t *testing.T) []*kgo.Record {
	t.Helper()
	order := uuid.New()
	placed, err := json.Marshal(reserva.OrderPlaced{OrderID: order, Customer: "stale", Items: []reserva.Item{{SKU: "apple", Qty: 1}}, PlacedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	decided, err := json.Marshal(reserva.StockDecision{OrderID: order, Items: []reserva.Item{{SKU: "apple", Qty: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	rec := func(topic, aggregateType, eventType string, payload []byte) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(order.String()), Value: payload, Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: []byte(uuid.NewString())},
			{Key: outbox.HeaderEventType, Value: []byte(eventType)},
			{Key: outbox.HeaderAggregateType, Value: []byte(aggregateType)},
			{Key: outbox.HeaderAggregateID, Value: []byte(order.String())},
		}}
	}
	return []*kgo.Record{
		rec(reserva.TopicOrders, reserva.AggregateOrder, reserva.EventOrderPlaced, placed),
		rec(reserva.TopicStock, reserva.AggregateStock, reserva.EventStockReserved, decided),
	}
}

// leaveStaleKafkaEvents writes staleEvents to the demo's topics, after the
// offsets its consumer groups committed (or where a new group starts).
func leaveStaleKafkaEvents(ctx context.Context, t *testing.T) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(ferrytest.Brokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	res, err := kadm.NewClient(cl).CreateTopics(ctx, 4, 1, nil, reserva.TopicOrders, reserva.TopicStock)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			t.Fatalf("create %s: %v", r.Topic, r.Err)
		}
	}
	if err := cl.ProduceSync(ctx, staleEvents(t)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// leaveStaleRabbitMQEvents puts staleEvents in the demo consumers' queues.
func leaveStaleRabbitMQEvents(ctx context.Context, t *testing.T, url, password string) {
	t.Helper()
	cfg := inbox.RabbitMQConfig{URL: url, Password: password, Shards: rabbitmq.ShardsDefault}
	for topic, consumer := range demoConsumers {
		if _, err := inbox.DeclareRabbitMQ(ctx, &cfg, consumer, []string{topic}); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := (&rabbitmq.Conn{URL: url, Password: password, Name: "reserva-demo-test"}).Dial(rabbitNames)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, rec := range staleEvents(t) {
		key, p, err := rabbitmq.Publishing(rec, cfg.Shards, "", 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, rec.Topic, key, true, false, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("stale %s not confirmed: %v", rec.Topic, err)
		}
	}
}
