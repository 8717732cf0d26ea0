package rabbitmq

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Name suffixes of a topic's dead-letter exchange and stream.
const (
	DeadLetterExchangeSuffix = ".dlx"
	DeadLetterStreamSuffix   = ".dlq"
)

// MaxNameBytes is the longest exchange or queue name, routing key, header
// name or message id AMQP 0-9-1 can carry (a short string).
const MaxNameBytes = 255

// DeliveryLimitDefault is the shard queues' x-delivery-limit when the
// consumer sets none: deliveries that failed (a worker that crashed or
// lost its connection holding the message) before the broker dead-letters
// the message itself. Ferry's workers never reject or requeue, so only
// crashes count.
const DeliveryLimitDefault = 50

// DeadLetterMaxAgeDefault is how long a dead-letter stream keeps what it
// holds: the window in which operators may list and redrive. The inbox's
// retention must cover it.
const DeadLetterMaxAgeDefault = "14D"

// QueueName is the quorum queue of a consumer's shard of a topic.
func QueueName(topic string, shard int, consumer string) string {
	return topic + "." + RoutingKey(shard) + "@" + consumer
}

// ParseQueueName splits a shard queue's name into its topic, shard and
// consumer.
func ParseQueueName(q string) (topic string, shard int, consumer string, ok bool) {
	at := strings.IndexByte(q, '@')
	if at < 4 || q[at-4] != '.' {
		return "", 0, "", false
	}
	shard, ok = ParseRoutingKey(q[at-3 : at])
	if !ok || at+1 >= len(q) {
		return "", 0, "", false
	}
	return q[:at-4], shard, q[at+1:], true
}

// Topology is what a consumer of some topics needs on the broker.
type Topology struct {
	Consumer string
	Topics   []string
	Shards   int
	// DeliveryLimit is x-delivery-limit; 0 means DeliveryLimitDefault.
	DeliveryLimit int
	// DeadLetterMaxAge is the dead-letter streams' x-max-age ("14D",
	// "48h"); "" means DeadLetterMaxAgeDefault.
	DeadLetterMaxAge string
}

// Check says why t cannot be declared, nil when it can; errors name the
// part at fault.
func (t *Topology) Check() error {
	if t.Consumer == "" {
		return errors.New("no consumer name")
	}
	if err := CheckShards(t.Shards); err != nil {
		return fmt.Errorf("shards: %w", err)
	}
	if t.DeliveryLimit < 0 {
		return fmt.Errorf("delivery limit %d: must be positive", t.DeliveryLimit)
	}
	for _, topic := range t.Topics {
		if q := QueueName(topic, t.Shards-1, t.Consumer); len(q) > MaxNameBytes {
			return fmt.Errorf("queue name %q is %d bytes, more than AMQP's %d: shorten the consumer or topic name", q, len(q), MaxNameBytes)
		}
	}
	return nil
}

// QueueArgs are the arguments of a shard queue of topic, every one explicit
// so that RabbitMQ 3.10 and 4.x behave alike: a quorum queue with a single
// active consumer (the partition: one consumer at a time, in order),
// at-least-once dead lettering to the topic's .dlx after deliveryLimit
// failed deliveries (4.x would otherwise drop after 20), and an overflow
// that refuses rather than drops. No length limit, no TTL, no expiry: a
// Ferry queue never discards what it was given.
func QueueArgs(topic string, deliveryLimit int) amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg:            amqp.QueueTypeQuorum,
		amqp.SingleActiveConsumerArg: true,
		amqp.QueueOverflowArg:        amqp.QueueOverflowRejectPublish,
		"x-delivery-limit":           int64(deliveryLimit),
		"x-dead-letter-exchange":     topic + DeadLetterExchangeSuffix,
		"x-dead-letter-strategy":     "at-least-once",
	}
}

// DeclareStream declares a stream that keeps what it holds for maxAge
// ("1D", "48h").
func DeclareStream(ch Channel, name, maxAge string) error {
	if _, err := ch.QueueDeclare(name, true, false, false, false, streamArgs(maxAge)); err != nil {
		return fmt.Errorf("declare stream %s: %w", name, err)
	}
	return nil
}

func streamArgs(maxAge string) amqp.Table {
	return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeStream, amqp.StreamMaxAgeArg: maxAge}
}

// Channel is the part of *amqp.Channel the declarations use.
type Channel interface {
	ExchangeDeclare(name, kind string, durable, autoDelete, internal, noWait bool, args amqp.Table) error
	QueueDeclare(name string, durable, autoDelete, exclusive, noWait bool, args amqp.Table) (amqp.Queue, error)
	QueueBind(name, key, exchange string, noWait bool, args amqp.Table) error
}

var _ Channel = (*amqp.Channel)(nil)

// DeclareExchange declares the exchange the relay publishes a topic to, and
// the topic's dead-letter exchange and stream.
func DeclareExchange(ch Channel, topic, deadLetterMaxAge string) error {
	if err := ch.ExchangeDeclare(topic, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", topic, err)
	}
	dlx, dlq := topic+DeadLetterExchangeSuffix, topic+DeadLetterStreamSuffix
	if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", dlx, err)
	}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, streamArgs(cmp.Or(deadLetterMaxAge, DeadLetterMaxAgeDefault))); err != nil {
		return fmt.Errorf("declare stream %s: %w", dlq, err)
	}
	if err := ch.QueueBind(dlq, "", dlx, false, nil); err != nil {
		return fmt.Errorf("bind stream %s to %s: %w", dlq, dlx, err)
	}
	return nil
}

// Declare declares t: each topic's exchanges and dead-letter stream, then
// the consumer's shard queues, each bound to its routing key. Declaring
// again what exists with the same arguments changes nothing; a queue that
// exists with other arguments fails with PRECONDITION_FAILED, and the
// channel is closed.
func Declare(ch Channel, t *Topology) error {
	if err := t.Check(); err != nil {
		return err
	}
	limit := t.DeliveryLimit
	if limit == 0 {
		limit = DeliveryLimitDefault
	}
	for _, topic := range t.Topics {
		if err := DeclareExchange(ch, topic, t.DeadLetterMaxAge); err != nil {
			return err
		}
		for s := range t.Shards {
			q := QueueName(topic, s, t.Consumer)
			if _, err := ch.QueueDeclare(q, true, false, false, false, QueueArgs(topic, limit)); err != nil {
				return fmt.Errorf("declare queue %s: %w", q, err)
			}
			if err := ch.QueueBind(q, RoutingKey(s), topic, false, nil); err != nil {
				return fmt.Errorf("bind queue %s to %s: %w", q, topic, err)
			}
		}
	}
	return nil
}

// Missing returns the shard queues of t that do not exist, asking with a
// passive declaration on a channel of its own for each (a missing queue
// closes the channel it was asked on).
func Missing(conn *amqp.Connection, t *Topology) ([]string, error) {
	var missing []string
	for _, topic := range t.Topics {
		for s := range t.Shards {
			q := QueueName(topic, s, t.Consumer)
			ok, err := queueExists(conn, q)
			if err != nil {
				return nil, err
			}
			if !ok {
				missing = append(missing, q)
			}
		}
	}
	return missing, nil
}

func queueExists(conn *amqp.Connection, q string) (bool, error) {
	_, ok, err := Inspect(conn, q)
	return ok, err
}

// Inspect declares queue q passively, on a channel of its own: its ready
// messages and consumers, and whether it exists.
func Inspect(conn *amqp.Connection, q string) (amqp.Queue, bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Queue{}, false, fmt.Errorf("open a channel: %w", err)
	}
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return amqp.Queue{}, false, nil
	}
	_ = ch.Close()
	if err != nil {
		return amqp.Queue{}, false, fmt.Errorf("queue %s: %w", q, err)
	}
	return st, true, nil
}
