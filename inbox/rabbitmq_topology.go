package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// ErrRabbitMQQueuesMissing is a RabbitMQConfig.NoCreate worker whose shard
// queues do not exist.
var ErrRabbitMQQueuesMissing = errors.New("inbox: RabbitMQ shard queues missing")

// DeclareRabbitMQ declares what consumer needs on the broker for topics:
// each topic's exchange, dead-letter exchange and stream, and the
// consumer's shard queues with every argument explicit. It returns the
// queues it created. A queue receives only what is published after it
// exists: events the relay published before are not in the queues it
// created. cfg takes its defaults (RabbitMQConfig's) first.
func DeclareRabbitMQ(ctx context.Context, cfg *RabbitMQConfig, consumer string, topics []string) (created []string, err error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	conn, err := dialCtx(ctx, &c, " declare")
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	return declareTopology(conn, &c, consumer, topics)
}

func dialCtx(ctx context.Context, cfg *RabbitMQConfig, suffix string) (*amqp.Connection, error) {
	type result struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := cfg.conn(suffix).Dial(rabbitNames)
		done <- result{conn, err}
	}()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

func declareTopology(conn *amqp.Connection, cfg *RabbitMQConfig, consumer string, topics []string) ([]string, error) {
	t := &rabbitmq.Topology{Consumer: consumer, Topics: topics, Shards: cfg.Shards, DeliveryLimit: cfg.DeliveryLimit}
	if err := t.Check(); err != nil {
		return nil, fmt.Errorf("inbox: RabbitMQ topology of consumer %s: %w", consumer, err)
	}
	missing, err := rabbitmq.Missing(conn, t)
	if err != nil {
		return nil, fmt.Errorf("inbox: RabbitMQ queues of consumer %s: %w", consumer, err)
	}
	if cfg.NoCreate {
		if len(missing) > 0 {
			return nil, fmt.Errorf("%w (Config.RabbitMQ.NoCreate): consumer %s: %s; declare them with `worker schema` before the relay publishes what the consumer must see",
				ErrRabbitMQQueuesMissing, consumer, strings.Join(missing, ", "))
		}
		return nil, nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("inbox: open a channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	// Declaring again what exists changes nothing; it also checks that the
	// queues that exist have Ferry's arguments (PRECONDITION_FAILED if not).
	if err := rabbitmq.Declare(ch, t); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			return nil, fmt.Errorf("inbox: consumer %s: %w: the queue exists with other arguments, and RabbitMQ never changes a queue's arguments "+
				"(Config.RabbitMQ.DeliveryLimit, or Shards, differs from when it was declared, or it was not declared by Ferry)", consumer, err)
		}
		return nil, fmt.Errorf("inbox: consumer %s: %w", consumer, err)
	}
	return missing, nil
}

// declareRabbitMQ declares (or, with NoCreate, verifies) the consumers'
// queues at start, waiting for a broker that does not answer yet. Queues it
// had to create are reported loudly: what was published before is not in
// them.
func (w *Worker) declareRabbitMQ(ctx context.Context, consumers []string) error {
	cfg := w.cfg.RabbitMQ
	var conn *amqp.Connection
	for n := 1; ; n++ {
		var err error
		if conn, err = dialCtx(ctx, cfg, " declare"); err == nil {
			break
		}
		var ne net.Error
		if ctx.Err() != nil || !errors.As(err, &ne) {
			return fmt.Errorf("inbox: %w", err)
		}
		wait := backoff.Delay(n, w.cfg.RetryBackoff, w.cfg.RetryBackoffMax)
		w.cfg.Logger.Warn("RabbitMQ unreachable at start; retrying", slog.Duration("retry_in", wait), slog.String("error", err.Error()))
		if !sleepCtx(ctx, wait) {
			return ctx.Err()
		}
	}
	defer func() { _ = conn.Close() }()
	for _, c := range consumers {
		topics := w.Topics(c)
		created, err := declareTopology(conn, cfg, c, topics)
		if err != nil {
			return err
		}
		if len(created) > 0 {
			w.metrics.queuesCreated.WithLabelValues(c).Add(float64(len(created)))
			w.metrics.nQueuesCreated.Add(int64(len(created)))
			w.cfg.Logger.Warn("created RabbitMQ shard queues that did not exist: events published to these topics before now are NOT in them and will never reach this consumer",
				slog.String("consumer", c), slog.Any("topics", topics), slog.Int("queues", len(created)), slog.Time("since", time.Now()))
		}
	}
	return nil
}
