package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// ReasonDeliveryLimit is the reason of a RabbitMQ broker dead letter: the
// shard queue's x-delivery-limit was reached (workers that died or lost
// their connection holding the message, again and again).
const ReasonDeliveryLimit DeadLetterReason = "delivery_limit"

// RabbitMQIdleDefault is how long a RabbitMQ dead-letter listing waits for
// one more message before it takes the stream to be read: AMQP 0-9-1 tells
// a stream reader no end.
const RabbitMQIdleDefault = 2 * time.Second

// parseRabbitDeadLetter reads a delivery of a .dlq stream: Ferry's dead
// letters by their ferry.dlq.* headers, the broker's by x-death (reason,
// and the consumer, topic and shard from the source queue's name).
func parseRabbitDeadLetter(d *amqp.Delivery, stream string) *DeadLetter {
	rec := rabbitmq.Record(d, stream, 0)
	rec.Offset = -1
	if off, ok := d.Headers["x-stream-offset"].(int64); ok {
		rec.Offset = off
	}
	dl, _ := ParseDeadLetter(rec)
	dl.Headers = dl.Headers[:0:0]
	for _, h := range rec.Headers {
		// x-* are the broker's (x-death, x-stream-offset): not the event's.
		if !strings.HasPrefix(h.Key, "x-") && !strings.HasPrefix(h.Key, deadLetterHeaderPrefix) {
			dl.Headers = append(dl.Headers, h)
		}
		if h.Key == HeaderDeadLetterOriginalQueue {
			dl.OriginalQueue = string(h.Value)
		}
	}
	if reason := rabbitmq.DeathReason(d); reason != "" && dl.Reason == "" {
		dl.Reason = DeadLetterReason(reason)
		dl.OriginalQueue = rabbitmq.DeathQueue(d)
		if topic, shard, consumer, ok := rabbitmq.ParseQueueName(dl.OriginalQueue); ok {
			dl.OriginalTopic, dl.OriginalPartition, dl.Consumer = topic, int32(shard), consumer
		}
		if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
			if t, ok := deaths[0].(amqp.Table); ok {
				if at, ok := t["time"].(time.Time); ok {
					dl.FailedAt = at
				}
				if n, ok := t["count"].(int64); ok {
					dl.Attempts = int(n)
				}
			}
		}
	}
	return dl
}

// ListRabbitMQDeadLetters reads the dead letters of a RabbitMQ .dlq stream
// (outbox.event.order.dlq) that match filter, without consuming them:
// Ferry's, with their reasons, and the broker's own (reason
// delivery_limit, the consumer named by the source queue). It stops when
// nothing came for idle (0: RabbitMQIdleDefault).
func ListRabbitMQDeadLetters(ctx context.Context, cfg *RabbitMQConfig, stream string, filter *DeadLetterFilter, idle time.Duration) ([]DeadLetter, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	conn, err := dialCtx(ctx, &c, " dlq")
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	return listRabbit(ctx, conn, stream, filter, idle)
}

func listRabbit(ctx context.Context, conn *amqp.Connection, stream string, filter *DeadLetterFilter, idle time.Duration) ([]DeadLetter, error) {
	if idle <= 0 {
		idle = RabbitMQIdleDefault
	}
	var out []DeadLetter
	err := rabbitmq.ReadStream(ctx, conn, stream, idle, func(d *amqp.Delivery) bool {
		if dl := parseRabbitDeadLetter(d, stream); filter.match(dl) {
			out = append(out, *dl)
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	return out, nil
}

// RedriveRabbitMQ republishes the dead letters of a RabbitMQ .dlq stream
// that match filter to the shard queue each came from, through the default
// exchange (only that consumer sees it), with its id and
// ferry.redrive.from, and waits for the broker's confirms. The inbox
// applies a redriven message once: redriving it again is a duplicate. A
// redriven message comes after what the queue holds already.
func RedriveRabbitMQ(ctx context.Context, cfg *RabbitMQConfig, stream string, filter *DeadLetterFilter, idle time.Duration) (*RedriveResult, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	conn, err := dialCtx(ctx, &c, " redrive")
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	dls, err := listRabbit(ctx, conn, stream, filter, idle)
	if err != nil {
		return nil, err
	}
	res := &RedriveResult{}
	var msgs []amqp.Publishing
	var queues []string
	for _, d := range dls {
		var why string
		switch {
		case d.Reason == "":
			why = "no " + HeaderDeadLetterReason + " header and no x-death: not a dead letter of Ferry or of the broker, not redriven"
		case d.OriginalQueue == "":
			why = "no " + HeaderDeadLetterOriginalQueue + " header: the shard queue it came from is unknown, not redriven"
		}
		headers := append(make([]kgo.RecordHeader, 0, len(d.Headers)+1), d.Headers...)
		headers = append(headers, kgo.RecordHeader{Key: HeaderRedrivenFrom, Value: fmt.Appendf(nil, "%s/%d", stream, d.Offset)})
		var msg amqp.Publishing
		if why == "" {
			var perr error
			_, msg, perr = rabbitmq.Publishing(&kgo.Record{Key: d.Key, Value: d.Value, Headers: dropHeader(headers, HeaderRedrivenFrom, len(headers)-1)},
				c.Shards, "", rabbitmq.MaxMessageBytesDefault)
			if perr != nil {
				why = perr.Error()
			}
		}
		if why != "" {
			res.Skipped = append(res.Skipped, d)
			res.SkipReasons = append(res.SkipReasons, fmt.Sprintf("dead letter %s/%d: %s", stream, d.Offset, why))
			continue
		}
		msgs = append(msgs, msg)
		queues = append(queues, d.OriginalQueue)
		res.Redriven = append(res.Redriven, d)
	}
	if err := res.nothingFound(filter); err != nil {
		res.Redriven = nil
		return res, fmt.Errorf("inbox: redrive from %s: %w", stream, err)
	}
	if len(msgs) == 0 {
		return res, nil
	}
	if err := publishConfirmed(ctx, conn, queues, msgs); err != nil {
		return &RedriveResult{Skipped: res.Skipped, SkipReasons: res.SkipReasons}, fmt.Errorf("inbox: redrive from %s: %w", stream, err)
	}
	return res, nil
}

// dropHeader returns hs without the earlier copies of key (keeping the one
// at keep), so a letter redriven twice carries one ferry.redrive.from.
func dropHeader(hs []kgo.RecordHeader, key string, keep int) []kgo.RecordHeader {
	out := hs[:0:0]
	for i, h := range hs {
		if h.Key != key || i == keep {
			out = append(out, h)
		}
	}
	return out
}

// publishConfirmed publishes each message to its queue through the default
// exchange, mandatory, and waits for every confirm.
func publishConfirmed(ctx context.Context, conn *amqp.Connection, queues []string, msgs []amqp.Publishing) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, len(msgs)))
	dcs := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for i, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queues[i], true, false, m)
		if err != nil {
			return fmt.Errorf("publish to %s: %w", queues[i], err)
		}
		dcs = append(dcs, dc)
	}
	var errs []error
	for i, dc := range dcs {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			errs = append(errs, fmt.Errorf("queue %s: the broker did not confirm message %s", queues[i], msgs[i].MessageId))
		}
	}
	for len(returns) > 0 {
		r := <-returns
		errs = append(errs, fmt.Errorf("%w: queue %s does not exist (message %s)", rabbitmq.ErrUnroutable, r.RoutingKey, r.MessageId))
	}
	return errors.Join(errs...)
}
