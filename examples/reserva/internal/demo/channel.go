package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// Brokers the demo runs on (--broker).
const (
	brokerKafka    = "kafka"
	brokerRabbitMQ = "rabbitmq"
)

// channel is what the demo does differently on Kafka and on RabbitMQ:
// everything else (the processes, the orders, the faults, the summary and
// its checks) is one code path.
type channel interface {
	// name is the broker's name in the summary.
	name() string
	// prepare makes the topology the demo's events need before any is
	// written, and notes what is on the broker already.
	prepare(ctx context.Context) (stale int64, err error)
	// records counts the records relayed to the two event topics since
	// prepare.
	records(ctx context.Context) (int64, error)
	// deadLetters lists this run's dead letters of both topics; final
	// waits longer for a stream that is slow to answer.
	deadLetters(ctx context.Context, since time.Time, final bool) ([]inbox.DeadLetter, error)
	// env is the relay's and the workers' environment for the broker.
	env() []string
	// workerArgs are the broker's own flags of reserva-worker run.
	workerArgs() []string
}

var demoTopics = []string{reserva.TopicOrders, reserva.TopicStock}

// demoConsumers is the consumer of each demo topic.
var demoConsumers = map[string]string{reserva.TopicOrders: reserva.ConsumerStockReservation, reserva.TopicStock: reserva.ConsumerOrderStatus}

type kafkaChannel struct {
	brokers string
	opts    []kgo.Opt
	start   int64
}

func (k *kafkaChannel) name() string { return "Kafka" }

func (k *kafkaChannel) prepare(ctx context.Context) (stale int64, err error) {
	k.opts = []kgo.Opt{kgo.SeedBrokers(strings.Split(k.brokers, ",")...)}
	cl, err := kgo.NewClient(k.opts...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics := []string{reserva.TopicOrders, reserva.TopicStock, reserva.TopicOrders + ".dlq", reserva.TopicStock + ".dlq"}
	res, err := adm.CreateTopics(ctx, 4, 1, nil, topics...)
	if err != nil {
		return 0, fmt.Errorf("create topics: %w", err)
	}
	for _, r := range res {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return 0, fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
		}
	}
	// The topics outlive the demo database: what an earlier run left
	// unconsumed on them (a run interrupted with its backlog, the records
	// its relay republished after its workers stopped) belongs to orders
	// that no longer exist. Applied in this run's database, an old
	// OrderPlaced takes this run's stock and an old StockReserved retries
	// until it is dead-lettered. Each group starts where its topic ends.
	for topic, group := range demoConsumers {
		n, err := skipToEnd(ctx, adm, group, topic)
		if err != nil {
			return stale, err
		}
		stale += n
	}
	k.start = 0
	k.start, err = k.records(ctx)
	return stale, err
}

// skipToEndOn is skipToEnd on the cluster of kopts.
func skipToEndOn(ctx context.Context, kopts []kgo.Opt, group, topic string) (int64, error) {
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	return skipToEnd(ctx, kadm.NewClient(cl), group, topic)
}

// skipToEnd commits group's offsets at the end of topic's partitions and
// returns how many records that skips (what the group would have read
// from its commits, or from the start without one), 0 when Kafka could
// not say. Kafka refuses the
// commit while members of the group are consuming: the workers of another
// demo on the same cluster.
func skipToEnd(ctx context.Context, adm *kadm.Client, group, topic string) (int64, error) {
	// The count is for the demo's output only: a cluster whose group
	// coordinator is not loaded yet (a new stack) answers no lag, and the
	// skip goes on without it.
	var skipped int64
	if lags, err := adm.Lag(ctx, group); err == nil && lags[group].DescribeErr == nil && lags[group].FetchErr == nil {
		for _, l := range lags[group].Lag[topic] {
			skipped += max(l.Lag, 0)
		}
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	if err := ends.Error(); err != nil {
		return 0, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	offsets := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) {
		offsets.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	resp, err := adm.CommitOffsets(ctx, group, offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("start consumer group %s at the end of %s (is another demo running on these brokers?): %w", group, topic, err)
	}
	return skipped, nil
}

// records counts the records on the two event topics.
func (k *kafkaChannel) records(ctx context.Context) (int64, error) {
	cl, err := kgo.NewClient(k.opts...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, demoTopics...)
	if err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n - k.start, nil
}

func (k *kafkaChannel) deadLetters(ctx context.Context, since time.Time, _ bool) ([]inbox.DeadLetter, error) {
	var out []inbox.DeadLetter
	for _, t := range demoTopics {
		// The topics outlive the demo database: count this run's only.
		dls, err := inbox.ListDeadLetters(ctx, k.opts, t+".dlq", &inbox.DeadLetterFilter{Since: since})
		if err != nil {
			return nil, err
		}
		out = append(out, dls...)
	}
	return out, nil
}

func (k *kafkaChannel) env() []string { return []string{"FERRY_KAFKA_BROKERS=" + k.brokers} }

func (k *kafkaChannel) workerArgs() []string { return []string{"--kafka-session-timeout", "6s"} }

// rabbitChannel runs the demo on RabbitMQ. A shard queue receives only what
// is published after it exists, so prepare declares both consumers' queues
// (as `reserva-worker schema --rabbitmq-url ...` would) before the relay
// starts and before any order is placed.
type rabbitChannel struct {
	cfg inbox.RabbitMQConfig
}

// tapPrefix names the demo's own stream, one per topic, bound to every
// shard's routing key beside the consumers' queues: the exact count of what
// the relay published (the broker's message rates are sampled, and lose
// the last interval of a connection killed with the relay). It is made
// after the consumers' queues, so it never makes routable an event whose
// consumer queue is missing.
const tapPrefix = "reserva-demo.tap."

func (r *rabbitChannel) name() string { return "RabbitMQ" }

func (r *rabbitChannel) conn() *rabbitmq.Conn {
	return &rabbitmq.Conn{URL: r.cfg.URL, Password: r.cfg.Password, Name: "reserva-demo"}
}

var rabbitNames = rabbitmq.Names{URL: "--rabbitmq-url", Password: "FERRY_TEST_RABBITMQ_PASSWORD or FERRY_RABBITMQ_PASSWORD"}

func (r *rabbitChannel) prepare(ctx context.Context) (stale int64, err error) {
	// Dialled first, so that a refusal names the demo's settings.
	conn, err := r.conn().Dial(rabbitNames)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	if stale, err = r.declareQueues(ctx, ch); err != nil {
		return 0, err
	}
	for _, topic := range demoTopics {
		tap := tapPrefix + topic
		if _, err := ch.QueueDelete(tap, false, false, false); err != nil {
			return 0, fmt.Errorf("delete %s: %w", tap, err)
		}
		if _, err := ch.QueueDeclare(tap, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
			return 0, fmt.Errorf("declare %s: %w", tap, err)
		}
		for s := range r.cfg.Shards {
			if err := ch.QueueBind(tap, rabbitmq.RoutingKey(s), topic, false, nil); err != nil {
				return 0, fmt.Errorf("bind %s to %s: %w", tap, topic, err)
			}
		}
	}
	return stale, nil
}

// declareQueues declares both consumers' shard queues and empties them,
// returning how many messages that dropped.
func (r *rabbitChannel) declareQueues(ctx context.Context, ch *amqp.Channel) (stale int64, err error) {
	for _, topic := range demoTopics {
		if _, err := inbox.DeclareRabbitMQ(ctx, &r.cfg, demoConsumers[topic], []string{topic}); err != nil {
			return 0, err
		}
		// The queues outlive the demo database: what an interrupted run
		// left in them belongs to orders that no longer exist.
		for s := range r.cfg.Shards {
			n, err := ch.QueuePurge(rabbitmq.QueueName(topic, s, demoConsumers[topic]), false)
			if err != nil {
				return 0, fmt.Errorf("purge the queues of %s: %w", topic, err)
			}
			stale += int64(n)
		}
	}
	return stale, nil
}

// records reads the taps from their start.
func (r *rabbitChannel) records(ctx context.Context) (int64, error) {
	conn, err := r.conn().Dial(rabbitNames)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close() }()
	var n int64
	for _, topic := range demoTopics {
		err := rabbitmq.ReadStream(ctx, conn, tapPrefix+topic, time.Second, func(*amqp.Delivery) bool { n++; return true })
		if err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (r *rabbitChannel) deadLetters(ctx context.Context, since time.Time, final bool) ([]inbox.DeadLetter, error) {
	// Reading a stream ends when nothing came for idle: short while the
	// demo polls once a second, longer for the summary.
	idle := 300 * time.Millisecond
	if final {
		idle = inbox.RabbitMQIdleDefault
	}
	var out []inbox.DeadLetter
	for _, t := range demoTopics {
		// The streams outlive the demo database: count this run's only.
		dls, err := inbox.ListRabbitMQDeadLetters(ctx, &r.cfg, t+".dlq", &inbox.DeadLetterFilter{Since: since}, idle)
		if err != nil {
			return nil, err
		}
		out = append(out, dls...)
	}
	return out, nil
}

func (r *rabbitChannel) env() []string {
	return []string{"FERRY_RABBITMQ_URL=" + r.cfg.URL, "FERRY_RABBITMQ_PASSWORD=" + r.cfg.Password,
		fmt.Sprintf("FERRY_RABBITMQ_SHARDS=%d", r.cfg.Shards)}
}

func (r *rabbitChannel) workerArgs() []string { return nil }
