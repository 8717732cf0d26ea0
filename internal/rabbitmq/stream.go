package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// StreamPrefetch is the credit of a stream reader: a stream consumer needs
// a prefetch, and its acks only return credit (they delete nothing).
const StreamPrefetch = 256

// ReadStream reads the stream (a dead-letter stream) from its first message
// without consuming it, calling fn for each delivery until fn returns false,
// ctx ends, or nothing came for idle: AMQP 0-9-1 tells a stream reader no
// end, so a quiet interval stands for it. A missing stream is an error that
// names it.
func ReadStream(ctx context.Context, conn *amqp.Connection, stream string, idle time.Duration, fn func(*amqp.Delivery) bool) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Qos(StreamPrefetch, 0, false); err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	ds, err := ch.ConsumeWithContext(ctx, stream, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("stream %s does not exist", stream)
		}
		return fmt.Errorf("read stream %s: %w", stream, err)
	}
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case d, ok := <-ds:
			if !ok {
				return fmt.Errorf("read stream %s: the channel closed", stream)
			}
			// The ack only returns credit: a stream keeps what was read.
			_ = d.Ack(false)
			if !fn(&d) {
				return nil
			}
			t.Reset(idle)
		}
	}
}

// DeathQueue is the queue a broker dead letter (x-death) came from, "" when
// the delivery is not one.
func DeathQueue(d *amqp.Delivery) string {
	if s, ok := d.Headers["x-first-death-queue"].(string); ok {
		return s
	}
	return ""
}
