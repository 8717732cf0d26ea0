package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// A RabbitMQ run (Options.Broker = BrokerRabbitMQ) goes through the
// stack's RabbitMQ node instead of Kafka: the relay publishes the run's
// topic to the exchange of that name, each consumer reads one quorum queue
// per shard, and the dead letters go to the topic's .dlq stream. The
// pipeline declares every consumer's queues before the relay starts: a
// queue receives only what is published after it is bound.

// RabbitMQFaults are the kinds a RabbitMQ run injects by default: those of
// AllFaults that apply to RabbitMQ (slot-drop-recover needs `relay
// recover`, and partition-stall the Kafka sink's acknowledgement hold,
// both Kafka-only), the broker's stop, kill and freeze, and a shard left
// without queues for a while (the no-mandatory control's fault, which a
// relay with mandatory must survive).
var RabbitMQFaults = []FaultKind{FaultRelayKill, FaultWorkerKill, FaultWorkerPause, FaultRelayPause, FaultPGRestart,
	FaultRabbitMQStop, FaultRabbitMQKill, FaultRabbitMQFreeze, FaultRabbitMQUnbind}

// rabbitConn is how the suite itself reaches the stack's node.
func (p *pipeline) rabbitConn(name string) *rabbitmq.Conn {
	return &rabbitmq.Conn{URL: p.stack.RabbitMQURL, Password: p.stack.RabbitMQPassword, Name: "ferry-faults " + name}
}

// dialRabbit connects to the node, retrying while it is down (a fault may
// have stopped it) until ctx ends.
func (p *pipeline) dialRabbit(ctx context.Context, name string) (*amqp.Connection, error) {
	var conn *amqp.Connection
	err := retry(ctx, func(context.Context) error {
		var err error
		conn, err = p.rabbitConn(name).Dial(rabbitmq.Names{URL: "FERRY_TEST_RABBITMQ_URL", Password: "FERRY_TEST_RABBITMQ_PASSWORD"})
		return err
	})
	return conn, err
}

// declareRabbitMQ declares the run's exchanges, dead-letter stream and the
// shard queues of every consumer, as `worker schema` would.
func (p *pipeline) declareRabbitMQ(ctx context.Context) error {
	if err := p.declareRabbitMQTopic(ctx, p.topic, p.consumers); err != nil {
		return err
	}
	if v, err := p.management(ctx, "/api/overview"); err == nil {
		var o struct {
			Version string `json:"rabbitmq_version"`
		}
		if json.Unmarshal(v, &o) == nil {
			p.stack.RabbitMQVersion = o.Version
		}
	}
	return nil
}

// rabbitTopic is an exchange of the run and the consumers of its queues.
type rabbitTopic struct {
	topic     string
	consumers []string
}

// declareRabbitMQTopic declares topic's exchanges, dead-letter stream and
// the shard queues of consumers (a migration's new channel).
func (p *pipeline) declareRabbitMQTopic(ctx context.Context, topic string, consumers []string) error {
	if p.stack.RabbitMQURL == "" {
		return fmt.Errorf("the stack in FERRY_STACK_DIR=%q has no RabbitMQ node: scripts/stack up gives it one", p.stack.Dir)
	}
	conn, err := p.dialRabbit(ctx, "declare")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	for _, c := range consumers {
		if err := rabbitmq.Declare(ch, &rabbitmq.Topology{Consumer: c, Topics: []string{topic}, Shards: p.o.shards()}); err != nil {
			return fmt.Errorf("declare the queues of %s: %w", c, err)
		}
	}
	p.rabbitTopics = append(p.rabbitTopics, rabbitTopic{topic, consumers})
	return nil
}

// deleteRabbitMQ deletes the run's exchanges, streams and queues.
func (p *pipeline) deleteRabbitMQ() {
	if len(p.rabbitTopics) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := p.dialRabbit(ctx, "cleanup")
	if err != nil {
		p.logf("delete the RabbitMQ queues: %v", err)
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer func() { _ = ch.Close() }()
	for _, t := range p.rabbitTopics {
		for _, c := range t.consumers {
			for s := range p.o.shards() {
				_, _ = ch.QueueDelete(rabbitmq.QueueName(t.topic, s, c), false, false, false)
			}
		}
		_, _ = ch.QueueDelete(t.topic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
		_ = ch.ExchangeDelete(t.topic, false, false)
		_ = ch.ExchangeDelete(t.topic+rabbitmq.DeadLetterExchangeSuffix, false, false)
		_ = ch.ExchangeDelete(unboundVia(t.topic, 0), false, false) // a fault cut short
	}
}

// unboundVia is the exchange unbindShard moves shard's queues of topic
// behind.
func unboundVia(topic string, shard int) string {
	return topic + ".fault-unbound." + rabbitmq.RoutingKey(shard)
}

// management GETs path of the node's management API.
func (p *pipeline) management(ctx context.Context, path string) ([]byte, error) {
	u, err := url.Parse(p.stack.RabbitMQURL)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(p.stack.RabbitMQManagementURL, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(u.User.Username(), p.stack.RabbitMQPassword)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("management GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	return b, nil
}

// queuesDone says whether every shard queue of every consumer is empty with
// nothing unacknowledged, and if not why. The management API's figures
// are refreshed every few seconds: drain wants them for longer than that.
func (p *pipeline) queuesDone(ctx context.Context, topic string, consumers []string) (bool, string) {
	var behind []string
	var total int64
	for _, c := range consumers {
		for s := range p.o.shards() {
			q := rabbitmq.QueueName(topic, s, c)
			b, err := p.management(ctx, "/api/queues/"+url.PathEscape(p.vhost())+"/"+url.PathEscape(q))
			if err != nil {
				return false, "queue " + q + ": " + err.Error()
			}
			var st struct {
				Messages       *int64 `json:"messages"`
				Unacknowledged *int64 `json:"messages_unacknowledged"`
			}
			if err := json.Unmarshal(b, &st); err != nil {
				return false, "queue " + q + ": " + err.Error()
			}
			if st.Messages == nil || st.Unacknowledged == nil {
				return false, "queue " + q + ": no figures yet"
			}
			if n := *st.Messages + *st.Unacknowledged; n > 0 {
				total += n
				behind = append(behind, q)
			}
		}
	}
	if len(behind) > 0 {
		return false, fmt.Sprintf("%d messages in %d shard queues (%s...)", total, len(behind), behind[0])
	}
	return true, "drained"
}

func (p *pipeline) vhost() string {
	u, err := url.Parse(p.stack.RabbitMQURL)
	if err != nil || strings.Trim(u.Path, "/") == "" {
		return "/"
	}
	return strings.TrimPrefix(u.Path, "/")
}

// rabbitConfig reaches the stack's RabbitMQ node as the suite does.
func (p *pipeline) rabbitConfig() *inbox.RabbitMQConfig {
	return &inbox.RabbitMQConfig{URL: p.stack.RabbitMQURL, Password: p.stack.RabbitMQPassword, Shards: p.o.shards(), Name: "ferry-faults"}
}

// rabbitDeadLetters reads the topic's .dlq stream without consuming it and
// returns, for consumer, the reason of every message id it dead-lettered
// (Ferry's and the broker's delivery-limit ones).
func (p *pipeline) rabbitDeadLetters(ctx context.Context, consumer, stream string) ([]inbox.DeadLetter, error) {
	dls, err := inbox.ListRabbitMQDeadLetters(ctx, p.rabbitConfig(), stream, &inbox.DeadLetterFilter{Consumer: consumer}, 0)
	if err != nil {
		return nil, fmt.Errorf("read the dead letters of %s from %s: %w", consumer, stream, err)
	}
	return dls, nil
}

// rabbitRelayArgs are the relay's RabbitMQ flags: its shards, a small
// largest message (the run's TopicMaxMessageBytes), so that the oversized
// events are quarantined, and the run's consumers as required ones (their
// queues must exist before the relay publishes), as docs/relay.md advises.
func (p *pipeline) rabbitRelayArgs() []string {
	return []string{"--rabbitmq-shards", strconv.Itoa(p.o.shards()), "--rabbitmq-max-message-bytes", strconv.Itoa(p.o.TopicMaxMessageBytes),
		"--rabbitmq-require-consumers", strings.Join(p.consumers, ",")}
}

// rabbitWorkerArgs are the checker workers' RabbitMQ flags. They must not
// declare what is missing: the pipeline declared it, and a queue missing
// now would be a fault of the run.
func (p *pipeline) rabbitWorkerArgs() []string {
	return []string{"--rabbitmq-shards", strconv.Itoa(p.o.shards()), "--rabbitmq-no-create"}
}

// unbindShard makes shard's routing key reach no queue (bind=false) or
// every consumer's queue again (bind=true), for every consumer at once.
// Unbinding the queues one by one would pass through a state in which the
// key reaches some consumers' queues and not others': the broker confirms
// such a message and returns nothing, and it is lost for the others, which
// no relay can see (mandatory only reports a message no queue took). So the
// queues are moved behind an exchange of the fault's own, bound to the
// topic's exchange by one binding that is removed and made again in one
// step; the queues' own bindings are back before it goes. Each state in
// between routes the key to every queue or to none: a queue reached by two
// bindings gets the message once.
func (p *pipeline) unbindShard(ctx context.Context, shard int, bind bool) error {
	conn, err := p.dialRabbit(ctx, "bind")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	key, via := rabbitmq.RoutingKey(shard), unboundVia(p.topic, shard)
	queues := make([]string, len(p.consumers))
	for i, c := range p.consumers {
		queues[i] = rabbitmq.QueueName(p.topic, shard, c)
	}
	step := func(what string, err error) error {
		if err != nil {
			return fmt.Errorf("unbind shard %d (bind %t): %s: %w", shard, bind, what, err)
		}
		return nil
	}
	if bind {
		if err := step("bind "+via, ch.ExchangeBind(via, key, p.topic, false, nil)); err != nil {
			return err
		}
		for _, q := range queues {
			if err := step("bind "+q, ch.QueueBind(q, key, p.topic, false, nil)); err != nil {
				return err
			}
		}
		return step("delete "+via, ch.ExchangeDelete(via, false, false))
	}
	if err := step("declare "+via, ch.ExchangeDeclare(via, amqp.ExchangeDirect, true, false, false, false, nil)); err != nil {
		return err
	}
	for _, q := range queues {
		if err := step("bind "+q+" to "+via, ch.QueueBind(q, key, via, false, nil)); err != nil {
			return err
		}
	}
	if err := step("bind "+via, ch.ExchangeBind(via, key, p.topic, false, nil)); err != nil {
		return err
	}
	for _, q := range queues {
		if err := step("unbind "+q, ch.QueueUnbind(q, key, p.topic, nil)); err != nil {
			return err
		}
	}
	return step("unbind "+via, ch.ExchangeUnbind(via, key, p.topic, false, nil))
}
