package relay_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// Set up the slot, write an event with outbox, run a relay and read what
// reached Kafka: the record's key is the aggregate id and its "id" header
// the outbox id, the one consumers deduplicate on.
func Example() {
	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	slot := os.Getenv("EXAMPLE_SLOT")               // normally relay.SlotDefault, "ferry"
	template := os.Getenv("EXAMPLE_TOPIC_TEMPLATE") // normally relay.TopicTemplateDefault

	// Once, before the application writes its first event (`relay migrate`
	// does it): from then on the slot keeps every committed event, even
	// before a relay runs.
	if err := relay.Setup(ctx, pool, slot, "", nil); err != nil {
		log.Fatal(err)
	}

	// The application writes the event in its own transaction.
	var ids []uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = outbox.Write(ctx, tx, outbox.Event{
			AggregateType: "order",
			AggregateID:   "order-42",
			EventType:     "OrderPlaced",
			Payload:       []byte(`{"total_cents":1999}`),
			Headers:       map[string]string{"content-type": "application/json"},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	r, err := relay.New(&relay.Config{
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		Slot:          slot,
		TopicTemplate: template,
		KafkaOpts:     []kgo.Opt{kgo.SeedBrokers(brokers...)},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stopRelay := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	rec := receive(ctx, brokers, strings.ReplaceAll(template, "{aggregate_type}", "order"), ids[0].String())
	fmt.Printf("key %s, value %s\n", rec.Key, rec.Value)
	for _, h := range rec.Headers {
		if h.Key == outbox.HeaderID {
			fmt.Println("id header is the outbox id:", string(h.Value) == ids[0].String())
			continue
		}
		fmt.Printf("header %s: %s\n", h.Key, h.Value)
	}

	// Run returns nil once its context ends, after Kafka acknowledged what
	// was in flight and the slot confirmed it.
	stopRelay()
	fmt.Println("run:", <-done)
	fmt.Println("published:", r.Stats().Published)
	// Output:
	// key order-42, value {"total_cents":1999}
	// id header is the outbox id: true
	// header event_type: OrderPlaced
	// header aggregate_type: order
	// header aggregate_id: order-42
	// header content-type: application/json
	// run: <nil>
	// published: 1
}

// Setup creates what is missing and changes nothing the second time;
// Status then shows the slot, which Ferry recorded as the one it publishes
// from.
func ExampleSetup() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	slot := os.Getenv("EXAMPLE_SLOT") // normally relay.SlotDefault, "ferry"

	for range 2 {
		if err := relay.Setup(ctx, pool, slot, relay.PublicationDefault, nil); err != nil {
			log.Fatal(err)
		}
	}
	st, err := relay.Status(ctx, pool, slot)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exists %t, plugin %s, recorded %t, quarantined %d\n", st.Exists, st.Plugin, st.Recorded, st.Quarantined)
	// Output: exists true, plugin pgoutput, recorded true, quarantined 0
}

// An event larger than its topic accepts is quarantined, and the relay
// publishes the events after it. Once the cause is fixed (here, the topic's
// max.message.bytes raised), Requeue moves it back into the outbox and the
// relay publishes it with its original id.
func ExampleRequeue() {
	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	slot := os.Getenv("EXAMPLE_SLOT")
	template := os.Getenv("EXAMPLE_TOPIC_TEMPLATE")
	topic := strings.ReplaceAll(template, "{aggregate_type}", "blob") // it takes at most 2 KiB a record
	if err := relay.Setup(ctx, pool, slot, "", nil); err != nil {
		log.Fatal(err)
	}

	r, err := relay.New(&relay.Config{
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		Slot:          slot,
		TopicTemplate: template,
		KafkaOpts:     []kgo.Opt{kgo.SeedBrokers(brokers...)},
		// Read a topic's max.message.bytes again after a second, not the
		// default minute, so that the raised limit applies at once.
		TopicConfigRefresh: time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stopRelay := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	payload := make([]byte, 10_000)
	_, _ = rand.Read(payload) // incompressible: the broker sees all of it
	var ids []uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = outbox.Write(ctx, tx, outbox.Event{AggregateType: "blob", AggregateID: "blob-1", EventType: "BlobStored", Payload: payload})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// What an operator sees with `relay quarantine list`.
	var quarantined []relay.QuarantinedEvent
	for len(quarantined) == 0 && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		if quarantined, err = relay.ListQuarantined(ctx, pool, 100); err != nil {
			log.Fatal(err)
		}
	}
	for _, q := range quarantined {
		fmt.Println("quarantined:", q.AggregateID, q.EventType, q.Reason, q.ID == ids[0])
	}

	// The fix: the topic takes records up to 1 MiB.
	adm := kadm.NewClient(must(kgo.NewClient(kgo.SeedBrokers(brokers...))))
	defer adm.Close()
	raised := "1048576"
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &raised}}, topic)
	if err == nil {
		_, err = res.On(topic, nil)
	}
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(2 * time.Second) // Config.TopicConfigRefresh

	n, err := relay.Requeue(ctx, pool, nil) // nil: every quarantined event
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("requeued:", n)
	rec := receive(ctx, brokers, topic, ids[0].String())
	fmt.Println("published with its id, bytes:", len(rec.Value))
	left, err := relay.ListQuarantined(ctx, pool, 100)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("still quarantined:", len(left))

	stopRelay()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stats: %d published, %d quarantined\n", r.Stats().Published, r.Stats().Quarantined)
	// Output:
	// quarantined: blob-1 BlobStored message_too_large true
	// requeued: 1
	// published with its id, bytes: 10000
	// still quarantined: 0
	// stats: 1 published, 1 quarantined
}

// CheckName tells the slot and publication names Ferry refuses before
// anything reaches PostgreSQL.
func ExampleCheckName() {
	fmt.Println(relay.CheckName("ferry_orders"))
	fmt.Println(relay.CheckName("Orders-Slot"))
	// Output:
	// <nil>
	// "Orders-Slot": use 1-63 lower-case letters, digits and underscores
}

// receive reads topic from its start, as a consumer would, until the record
// whose id header is id arrives.
func receive(ctx context.Context, brokers []string, topic, id string) *kgo.Record {
	cl := must(kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	))
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			log.Fatalf("no record %s on %s: %v", id, topic, err)
		}
		for _, rec := range fetches.Records() {
			for _, h := range rec.Headers {
				if h.Key == outbox.HeaderID && string(h.Value) == id {
					return rec
				}
			}
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}
