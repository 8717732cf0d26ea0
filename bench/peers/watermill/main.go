// Command watermill-peer is Watermill's SQL-to-Kafka forwarder set up for
// `make bench-peers`: the peer Ferry's relay is compared with. It lives in a
// module of its own so that Ferry's go.mod never requires Watermill.
//
// Watermill's forwarder does not read Ferry's outbox table: the application
// publishes through Watermill's SQL publisher, wrapped by the forwarder's
// publisher, into a table of Watermill's own (watermill_<forwarder topic>);
// the forwarder polls that table and publishes each message to Kafka. So the
// benchmark writes the same events (same count, payload, key and event
// headers) through Watermill's publisher.
//
//	watermill-peer backlog  -db URL -forwarder-topic T -topic DEST -events N   write a backlog, one transaction
//	watermill-peer backlog  ... -per-tx K                                      in transactions of K events
//	watermill-peer forward  -db URL -brokers B -forwarder-topic T              run the forwarder until SIGTERM; "ready" on stdout once it polls
//	watermill-peer forward  -db URL -amqp-url U -forwarder-topic T             the same to RabbitMQ with watermill-amqp (password in FERRY_RABBITMQ_PASSWORD)
//	watermill-peer backlog  ... -shard-keys K0,K1,...                          for RabbitMQ: aggregate agg-i goes with routing key Ki (see amqpTopic)
//	watermill-peer write    -db URL -forwarder-topic T -topic DEST -rate R -for D  one event per transaction at R/s; "<uuid> <unix ns>" per commit
//	watermill-peer versions                                                    the modules it was built with
//	watermill-peer settings                                                    the forwarder's settings, as printed in the results
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The forwarder's settings. Watermill's SQL subscriber reads
// subscribeBatchSize rows per polling transaction (its doc: a higher value
// is faster, 1 is the safest) and waits pollInterval after an empty poll
// (default 1 s). The Kafka publisher is Watermill's, synchronous: each
// message waits for the broker's ack before the next is read.
const (
	subscribeBatchSize = 1000
	pollInterval       = 10 * time.Millisecond
)

// Metadata keys of each message; the Kafka marshaler turns metadata into
// record headers. aggregate_id is also the record key.
const (
	metaAggregateID   = "aggregate_id"
	metaAggregateType = "aggregate_type"
	metaEventType     = "event_type"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: watermill-peer backlog|forward|write|versions|settings [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	db := fs.String("db", "", "PostgreSQL URL")
	brokers := fs.String("brokers", "", "Kafka seed brokers, host:port[,host:port]")
	fwdTopic := fs.String("forwarder-topic", "", "the forwarder's SQL topic (table watermill_<topic>)")
	topic := fs.String("topic", "", "the Kafka topic the events are forwarded to")
	events := fs.Int("events", 200_000, "backlog size")
	perTx := fs.Int("per-tx", 0, "backlog in transactions of this many events (0: one transaction)")
	payload := fs.Int("payload", 200, "payload bytes per event")
	rate := fs.Int("rate", 1000, "events per second offered by write")
	writers := fs.Int("writers", 4, "writers of write, each at rate/writers")
	dur := fs.Duration("for", 15*time.Second, "how long write offers events")
	amqpURL := fs.String("amqp-url", "", "forward to RabbitMQ at this amqp://user@host:port/vhost (password in FERRY_RABBITMQ_PASSWORD) instead of Kafka")
	shardKeys := fs.String("shard-keys", "", "backlog for RabbitMQ: the routing key of aggregate agg-i is the i-th of these, comma-separated")
	_ = fs.Parse(os.Args[2:])
	var keys []string
	if *shardKeys != "" {
		keys = strings.Split(*shardKeys, ",")
	}

	var err error
	switch os.Args[1] {
	case "backlog":
		err = backlog(ctx, *db, *fwdTopic, *topic, *events, *perTx, *payload, keys)
	case "forward":
		err = forward(ctx, *db, *brokers, *amqpURL, *fwdTopic)
	case "write":
		err = write(ctx, *db, *fwdTopic, *topic, *rate, *writers, *dur, *payload)
	case "versions":
		err = versions()
	case "settings":
		fmt.Print(settings())
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "watermill-peer:", err)
		os.Exit(1)
	}
}

func schema() wsql.DefaultPostgreSQLSchema {
	return wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: subscribeBatchSize}
}

func settings() string {
	return fmt.Sprintf("schema adapter=DefaultPostgreSQLSchema (payload column JSON: the forwarder's envelope is JSON), SubscribeBatchSize=%d\n"+
		"offsets adapter=DefaultPostgreSQLOffsetsAdapter (one offsets row per consumer group, updated once per polled batch, in the polling transaction)\n"+
		"subscriber: PollInterval=%s, ResendInterval=1s (default), AckDeadline=30s (default), pgx pool (BeginnerFromPgx)\n"+
		"publisher: watermill-kafka sync publisher (sarama SyncProducer), RequiredAcks=WaitForAll, protocol version 3.6.0, "+
		"key=aggregate id (NewWithPartitioningMarshaler), hash partitioner\n"+
		"with -amqp-url: watermill-amqp publisher, DefaultMarshaler (persistent), direct exchange, routing key = the aggregate's shard "+
		"(carried in the destination topic), Mandatory=true, ChannelPoolSize=%d, ConfirmDelivery=true (each Publish waits for its confirm; no return listener)\n",
		subscribeBatchSize, pollInterval, amqpChannels)
}

// newMessage is one event: the benchmark's payload, its aggregate as the
// key, and the event's type and aggregate type as headers, as Ferry sends.
func newMessage(payload int, aggregateID string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(strings.Repeat("x", payload)))
	msg.Metadata.Set(metaAggregateID, aggregateID)
	msg.Metadata.Set(metaAggregateType, "load")
	msg.Metadata.Set(metaEventType, "Changed")
	msg.Metadata.Set("k", "v")
	return msg
}

// publishTx writes msgs through the forwarder's publisher in tx: the
// forwarder's envelope, in Watermill's SQL table.
func publishTx(tx pgx.Tx, fwdTopic, topic string, msgs ...*message.Message) error {
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema()}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: fwdTopic}).Publish(topic, msgs...)
}

// initSchema creates Watermill's messages and offsets tables for fwdTopic.
func initSchema(pool *pgxpool.Pool, fwdTopic string) error {
	sub, err := newSubscriber(pool)
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(fwdTopic)
}

func newSubscriber(pool *pgxpool.Pool) (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		SchemaAdapter:  schema(),
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		PollInterval:   pollInterval,
	}, watermill.NopLogger{})
}

func backlog(ctx context.Context, db, fwdTopic, topic string, events, perTx, payload int, keys []string) error {
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := initSchema(pool, fwdTopic); err != nil {
		return fmt.Errorf("initialize watermill schema: %w", err)
	}
	if perTx > 0 && perTx < events && keys == nil {
		// Transactions of perTx, as the other peers' shaped backlog,
		// committed without waiting for each flush.
		for i := 0; i < events; i += perTx {
			msgs := make([]*message.Message, 0, perTx)
			for j := i; j < min(i+perTx, events); j++ {
				msgs = append(msgs, newMessage(payload, "agg-"+strconv.Itoa(j%1000)))
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
					return err
				}
				return publishTx(tx, fwdTopic, topic, msgs...)
			}); err != nil {
				return err
			}
		}
		return nil
	}
	// One transaction, as the other peers' backlog; Watermill's insert
	// takes a message per row of a multi-row INSERT, so it is sent in
	// statements of 1,000 messages (PostgreSQL's 65,535 parameters).
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		const perStatement = 1000
		for i := 0; i < events; i += perStatement {
			if keys != nil {
				// One destination per routing key: a statement each, in
				// the order of the aggregates' events.
				byKey := map[string][]*message.Message{}
				var order []string
				for j := i; j < min(i+perStatement, events); j++ {
					k := keys[j%1000%len(keys)]
					if byKey[k] == nil {
						order = append(order, k)
					}
					byKey[k] = append(byKey[k], newMessage(payload, "agg-"+strconv.Itoa(j%1000)))
				}
				for _, k := range order {
					if err := publishTx(tx, fwdTopic, amqpTopic(topic, k), byKey[k]...); err != nil {
						return err
					}
				}
				continue
			}
			msgs := make([]*message.Message, 0, perStatement)
			for j := i; j < min(i+perStatement, events); j++ {
				msgs = append(msgs, newMessage(payload, "agg-"+strconv.Itoa(j%1000)))
			}
			if err := publishTx(tx, fwdTopic, topic, msgs...); err != nil {
				return err
			}
		}
		return nil
	})
}

func forward(ctx context.Context, db, brokers, amqpURL, fwdTopic string) error {
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	sub, err := newSubscriber(pool)
	if err != nil {
		return err
	}
	var pub message.Publisher
	if amqpURL != "" {
		pub, err = amqpPublisher(amqpURL, os.Getenv("FERRY_RABBITMQ_PASSWORD"))
	} else {
		pub, err = kafkaPublisher(brokers)
	}
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(sub, pub, watermill.NewStdLogger(false, false), forwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-fwd.Running():
			fmt.Println("ready")
		case <-ctx.Done():
		}
	}()
	if err := fwd.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return pub.Close()
}

// amqpTopic is the destination topic of a message for RabbitMQ: the
// exchange and the routing key, which watermill-amqp derives from the
// topic alone (Publish.GenerateRoutingKey takes no message), so the
// backlog writes each shard's messages to a topic of their own.
func amqpTopic(exchange, key string) string { return exchange + "|" + key }

// amqpPublisher is watermill-amqp's publisher set as close to Ferry's
// relay as it goes: persistent messages (DefaultMarshaler), mandatory, a
// pool of 4 channels (the relay's default), publisher confirms. Its
// Publish waits for each message's confirm before it returns
// (ConfirmDelivery), and it registers no return listener: a message the
// broker returns as unroutable is confirmed all the same.
func amqpPublisher(raw, password string) (message.Publisher, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	u.User = url.UserPassword(u.User.Username(), password)
	cfg := wamqp.Config{
		Connection: wamqp.ConnectionConfig{AmqpURI: u.String()},
		Marshaler:  wamqp.DefaultMarshaler{},
		Exchange: wamqp.ExchangeConfig{
			GenerateName: func(topic string) string { ex, _, _ := strings.Cut(topic, "|"); return ex },
			Type:         "direct",
			Durable:      true,
		},
		Publish: wamqp.PublishConfig{
			GenerateRoutingKey: func(topic string) string { _, key, _ := strings.Cut(topic, "|"); return key },
			Mandatory:          true,
			ChannelPoolSize:    amqpChannels,
			ConfirmDelivery:    true,
		},
		TopologyBuilder: &wamqp.DefaultTopologyBuilder{},
	}
	return wamqp.NewPublisher(cfg, watermill.NopLogger{})
}

// amqpChannels is the publisher's channel pool: the relay's default
// --rabbitmq-channels.
const amqpChannels = 4

func kafkaPublisher(brokers string) (message.Publisher, error) {
	sc := kafka.DefaultSaramaSyncPublisherConfig()
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Version = sarama.V3_6_0_0
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: strings.Split(brokers, ","),
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(metaAggregateID), nil
		}),
		OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
}

// write offers rate events per second for dur from four writers, each
// event in a transaction of its own, and prints each message's uuid and
// the time its commit returned.
func write(ctx context.Context, db, fwdTopic, topic string, rate, writers int, dur time.Duration, payload int) error {
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	writers = max(writers, 1)
	interval := time.Duration(float64(time.Second) * float64(writers) / float64(rate))
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	out := make(chan string, 4096)
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		w := os.Stdout
		for line := range out {
			fmt.Fprintln(w, line)
		}
	}()
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; time.Since(start) < dur && ctx.Err() == nil; i++ {
				<-tick.C
				msg := newMessage(payload, fmt.Sprintf("w%d-%d", w, i%100))
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return publishTx(tx, fwdTopic, topic, msg) })
				if err != nil {
					mu.Lock()
					firstErr = errors.Join(firstErr, err)
					mu.Unlock()
					return
				}
				out <- msg.UUID + " " + strconv.FormatInt(time.Now().UnixNano(), 10)
			}
		}()
	}
	wg.Wait()
	close(out)
	<-printed
	return firstErr
}

func versions() error {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return errors.New("no build info")
	}
	fmt.Println(bi.GoVersion)
	for _, d := range bi.Deps {
		if strings.Contains(d.Path, "ThreeDotsLabs") || d.Path == "github.com/IBM/sarama" || d.Path == "github.com/jackc/pgx/v5" {
			fmt.Println(d.Path, d.Version)
		}
	}
	return nil
}
