package rabbitmq_test

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	c := &rabbitmq.Conn{URL: os.Getenv(ferrytest.EnvRabbitMQURL), Password: os.Getenv(ferrytest.EnvRabbitMQPassword)}
	if c.URL == "" {
		ferrytest.RabbitMQURL(t) // fails the test, naming the variable
	}
	conn, err := c.Dial(rabbitmq.Names{URL: "url", Password: "password"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func channel(t *testing.T, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// TestDeclareMakesWhatTheBrokerKeeps checks the topology on a real node:
// the queues exist with every argument Ferry sets (none left to the
// broker's defaults), declaring again changes nothing, Missing sees them,
// and a message published to the exchange lands in its shard's queue only.
func TestDeclareMakesWhatTheBrokerKeeps(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	topic := ferrytest.Name(t, "outbox.event.decl")
	top := &rabbitmq.Topology{Consumer: "c1", Topics: []string{topic}, Shards: 4, DeliveryLimit: 7}
	t.Cleanup(func() { cleanup(conn, top) })
	missing, err := rabbitmq.Missing(conn, top)
	if err != nil || len(missing) != 4 {
		t.Fatalf("before Declare, Missing = %v, %v; want the 4 queues", missing, err)
	}
	for range 2 {
		if err := rabbitmq.Declare(channel(t, conn), top); err != nil {
			t.Fatalf("Declare: %v", err)
		}
	}
	if missing, err := rabbitmq.Missing(conn, top); err != nil || len(missing) != 0 {
		t.Fatalf("after Declare, Missing = %v, %v", missing, err)
	}
	q := rabbitmq.QueueName(topic, 2, "c1")
	body, err := ferrytest.RabbitMQManagement(t, "GET", "/api/queues/ferry/"+url.PathEscape(q), nil)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Arguments map[string]any `json:"arguments"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	for k, want := range map[string]any{
		"x-queue-type": "quorum", "x-single-active-consumer": true, "x-overflow": "reject-publish",
		"x-delivery-limit": float64(7), "x-dead-letter-exchange": topic + ".dlx", "x-dead-letter-strategy": "at-least-once",
	} {
		if info.Arguments[k] != want {
			t.Errorf("queue %s argument %s = %v, want %v", q, k, info.Arguments[k], want)
		}
	}

	ch := channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	if err := ch.Publish(topic, rabbitmq.RoutingKey(2), true, false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if c := <-confirms; !c.Ack {
		t.Fatal("nacked")
	}
	for s := range 4 {
		got, err := ch.QueueDeclarePassive(rabbitmq.QueueName(topic, s, "c1"), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 1, false: 0}[s == 2]; got.Messages != want {
			t.Errorf("shard %d queue holds %d messages, want %d", s, got.Messages, want)
		}
	}
}

// TestDeclareRefusesAQueueWithOtherArguments checks that a queue someone
// made with other arguments (here: no dead-letter target, a length limit)
// is an error naming it, not silently kept.
func TestDeclareRefusesAQueueWithOtherArguments(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	topic := ferrytest.Name(t, "outbox.event.other")
	top := &rabbitmq.Topology{Consumer: "c1", Topics: []string{topic}, Shards: 1}
	t.Cleanup(func() { cleanup(conn, top) })
	q := rabbitmq.QueueName(topic, 0, "c1")
	if _, err := channel(t, conn).QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-max-length": int64(10)}); err != nil {
		t.Fatal(err)
	}
	err := rabbitmq.Declare(channel(t, conn), top)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(err.Error(), q) {
		t.Fatalf("Declare over a queue with other arguments = %v; want PRECONDITION_FAILED naming %s", err, q)
	}
}

func cleanup(conn *amqp.Connection, top *rabbitmq.Topology) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	for _, topic := range top.Topics {
		for s := range top.Shards {
			_, _ = ch.QueueDelete(rabbitmq.QueueName(topic, s, top.Consumer), false, false, false)
		}
		_, _ = ch.QueueDelete(topic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
		_ = ch.ExchangeDelete(topic+rabbitmq.DeadLetterExchangeSuffix, false, false)
		_ = ch.ExchangeDelete(topic, false, false)
	}
}
