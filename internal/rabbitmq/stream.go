package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	return ReadStreamFrom(ctx, conn, stream, "first", idle, fn)
}

// streamCloseWait bounds how long a stream reader waits for its channel's
// close-ok: RabbitMQ 3.10 was seen never to answer the close of a channel
// whose stream consumer was still being fed by a writer.
const streamCloseWait = 2 * time.Second

// ReadStreamFrom is ReadStream from offset: "first", or a time.Time (the
// first chunk written at or after it, so a message or a few before may
// come too). It waits at most streamCloseWait for its channel to close:
// a stream others write to is best read on a connection of its own,
// closed with a deadline.
func ReadStreamFrom(ctx context.Context, conn *amqp.Connection, stream string, offset any, idle time.Duration, fn func(*amqp.Delivery) bool) error {
	// The consume of a stream was answered, in make test's race runs (a
	// controller reading the report stream that parallel tests' workers
	// write), with INTERNAL_ERROR (541) once, and once with
	// PRECONDITION_FAILED (406) "does not have a replica on the local
	// node": the broker had no running member of the stream on the node
	// at that moment (its coordinator starts and restarts members apart
	// from the declare). Neither came again alone. The broker closes the
	// channel then, before any delivery, so the read starts again on a new
	// one, a few times.
	for attempt := 1; ; attempt++ {
		err := readStreamFrom(ctx, conn, stream, offset, idle, fn)
		if !streamConsumeTransient(err) || attempt == streamConsumeAttempts || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
}

// streamConsumeAttempts bounds the reads of a stream whose consume the
// broker refused for a moment (streamConsumeTransient): about 5 s of
// waits in all.
const streamConsumeAttempts = 7

// streamConsumeTransient reports whether err is a refusal of a stream's
// consume that a new channel may not meet: INTERNAL_ERROR, or no member of
// the stream running on the node for now. On a cluster whose stream has
// no replica on the node at all, the last attempt's error says so.
func streamConsumeTransient(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	return ae.Code == amqp.InternalError ||
		ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, "does not have a replica on the local node")
}

// readStreamFrom is one read of ReadStreamFrom. Its only *amqp.Error
// returns come before any delivery (the qos and the consume).
func readStreamFrom(ctx context.Context, conn *amqp.Connection, stream string, offset any, idle time.Duration, fn func(*amqp.Delivery) bool) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	defer func() {
		closed := make(chan struct{})
		go func() { _ = ch.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(streamCloseWait):
		}
	}()
	if err := ch.Qos(StreamPrefetch, 0, false); err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	ds, err := ch.ConsumeWithContext(ctx, stream, "", false, false, false, false, amqp.Table{"x-stream-offset": offset})
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
