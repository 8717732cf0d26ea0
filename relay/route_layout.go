package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// channelLayout tells how many fences a topic of a channel takes: one per
// partition on Kafka, one per shard on RabbitMQ.
type channelLayout interface {
	// counts returns the partition (or shard) count of each of topics that
	// exists and may be written now; with no topic named, of every topic
	// the channel lists (none when it cannot list them). An error is the
	// channel not answering: the caller retries.
	counts(ctx context.Context, topics ...string) (map[string]int, error)
	// lists reports whether counts with no topic named lists them all.
	lists() bool
}

// layoutOf is the layout of the channel sink writes; nil for a
// Config.Sink.
func layoutOf(sink Sink) channelLayout {
	switch sk := sink.(type) {
	case *kafkaSink:
		return kafkaLayout{kadm.NewClient(sk.client())}
	case *rabbitmqSink:
		return rabbitLayout{sk}
	}
	return nil
}

// kafkaLayout reads a Kafka channel's metadata.
type kafkaLayout struct{ adm *kadm.Client }

func (l kafkaLayout) lists() bool { return true }

func (l kafkaLayout) counts(ctx context.Context, topics ...string) (map[string]int, error) {
	td, err := l.adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(td))
	for name, d := range td {
		if d.Err == nil && len(d.Partitions) > 0 {
			out[name] = len(d.Partitions)
		}
	}
	return out, nil
}

// rabbitLayout probes a RabbitMQ channel's exchanges: every exchange has
// the channel's shards. AMQP cannot list exchanges, so it names none of
// its own accord. An exchange that is missing, refuses the relay's writes
// or lacks a required consumer's shard queue holds nothing to fence yet:
// its records are held by the gate, and the fence comes before the first
// one that goes out.
type rabbitLayout struct{ s *rabbitmqSink }

func (l rabbitLayout) lists() bool { return false }

func (l rabbitLayout) counts(ctx context.Context, topics ...string) (map[string]int, error) {
	out := make(map[string]int, len(topics))
	for _, topic := range topics {
		rc := l.s.current()
		err := rc.probe(ctx, topic)
		switch {
		case err == nil:
			rc.learned(topic)
			out[topic] = l.s.shards
		case errors.Is(err, rabbitmq.ErrExchangeMissing), errors.Is(err, rabbitmq.ErrAccessRefused),
			errors.Is(err, rabbitmq.ErrConsumerQueuesMissing):
		default:
			if rc.gone() {
				return nil, fmt.Errorf("%w: %w", errLayoutGone, err)
			}
			return nil, err
		}
	}
	return out, nil
}

// errLayoutGone is a channel's metadata refused for good on the session's
// connection: a RabbitMQ connection that failed stays failed until the
// session ends and the sink dials anew (AbortBufferedRecords), so asking
// it again would wait forever.
var errLayoutGone = errors.New("the channel's connection failed; the session starts over on a new one")
