package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// ConsumerStatus is one consumer's state: its Kafka consumer group (named
// after the consumer) or its RabbitMQ shard queues, and its inbox rows.
type ConsumerStatus struct {
	Consumer string
	// GroupState is Kafka's state of the group: Stable, Empty, Dead,
	// PreparingRebalance, CompletingRebalance. On RabbitMQ it is
	// "declared" when every shard queue of the consumer exists, or says
	// how many are missing (a queue only receives what is published after
	// it exists: see DeclareRabbitMQ).
	GroupState string
	// Members is the group's members; on RabbitMQ, the most consumers
	// registered on one shard queue (one is active, the others wait).
	Members int
	// Lag is, per topic, the records after the group's committed offsets.
	// A partition without a committed offset counts from its start. On
	// RabbitMQ it is the messages ready in the shard queues, not yet
	// delivered to a worker; what a worker holds unacknowledged is not in
	// it (ferry_worker_lag counts both).
	Lag map[string]int64
	// InboxMessages is how many message ids the inbox remembers for the
	// consumer; NewestApplied is when the newest was applied (zero if none).
	InboxMessages int64
	NewestApplied time.Time
}

// TotalLag is the lag over every topic.
func (s *ConsumerStatus) TotalLag() int64 {
	var n int64
	for _, l := range s.Lag {
		n += l
	}
	return n
}

// Status describes each consumer: its group's state and lag from Kafka and
// its inbox rows from db. kafkaOpts reach the cluster (seed brokers, TLS,
// SASL). The database is read first: one without the inbox table (Ferry's
// migrations not applied, or the wrong database) is ErrInboxMissing,
// whatever Kafka knows of the consumers.
func Status(ctx context.Context, db outbox.DBTX, kafkaOpts []kgo.Opt, consumers ...string) ([]ConsumerStatus, error) {
	out, err := inboxStatus(ctx, db, consumers)
	if err != nil || len(out) == 0 {
		return out, err
	}
	cl, err := kgo.NewClient(kafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("inbox: kafka client: %w", err)
	}
	defer cl.Close()
	lags, err := kadm.NewClient(cl).Lag(ctx, consumers...)
	if err != nil {
		return nil, fmt.Errorf("inbox: describe consumer groups: %w", err)
	}
	for i := range out {
		st := &out[i]
		g, ok := lags[st.Consumer]
		if !ok {
			continue
		}
		if err := errors.Join(g.DescribeErr, g.FetchErr); err != nil {
			return nil, fmt.Errorf("inbox: consumer group %s: %w", st.Consumer, err)
		}
		st.GroupState, st.Members = g.State, len(g.Members)
		for topic, tl := range g.Lag.TotalByTopic() {
			st.Lag[topic] = tl.Lag
		}
	}
	slices.SortFunc(out, func(a, b ConsumerStatus) int { return strings.Compare(a.Consumer, b.Consumer) })
	return out, nil
}

// inboxStatus reads each consumer's inbox rows: a database without the
// inbox table is ErrInboxMissing.
func inboxStatus(ctx context.Context, db outbox.DBTX, consumers []string) ([]ConsumerStatus, error) {
	q := dbsqlc.New()
	out := make([]ConsumerStatus, 0, len(consumers))
	for _, c := range consumers {
		st := ConsumerStatus{Consumer: c, Lag: map[string]int64{}}
		var err error
		if st.InboxMessages, err = q.InboxCountByConsumer(ctx, db, c); err != nil {
			if pgerr.UndefinedTable(err) {
				return nil, ErrInboxMissing
			}
			return nil, fmt.Errorf("inbox: count inbox rows of %s: %w", c, err)
		}
		st.NewestApplied, err = q.InboxNewestByConsumer(ctx, db, c)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("inbox: read inbox of %s: %w", c, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// RabbitMQStatus is Status for consumers of RabbitMQ: each consumer's
// shard queues of topics (RabbitMQ names no consumer's topics: a queue
// is found by its name), read with passive declarations, and its inbox
// rows from db.
func RabbitMQStatus(ctx context.Context, db outbox.DBTX, cfg *RabbitMQConfig, topics []string, consumers ...string) ([]ConsumerStatus, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if len(topics) == 0 {
		return nil, errors.New("inbox: RabbitMQ status needs the consumers' topics")
	}
	out, err := inboxStatus(ctx, db, consumers)
	if err != nil || len(out) == 0 {
		return out, err
	}
	conn, err := dialCtx(ctx, &c, " status")
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	for i := range out {
		st := &out[i]
		missing := 0
		for _, topic := range topics {
			for s := range c.Shards {
				q, ok, err := rabbitmq.Inspect(conn, rabbitmq.QueueName(topic, s, st.Consumer))
				if err != nil {
					return nil, fmt.Errorf("inbox: consumer %s: %w", st.Consumer, err)
				}
				if !ok {
					missing++
					continue
				}
				st.Lag[topic] += int64(q.Messages)
				st.Members = max(st.Members, q.Consumers)
			}
		}
		st.GroupState = "declared"
		if missing > 0 {
			st.GroupState = fmt.Sprintf("%d of %d queues missing", missing, len(topics)*c.Shards)
		}
	}
	slices.SortFunc(out, func(a, b ConsumerStatus) int { return strings.Compare(a.Consumer, b.Consumer) })
	return out, nil
}
