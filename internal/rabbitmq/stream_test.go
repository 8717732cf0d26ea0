package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// A stream read at once after another connection declared it and wrote
// to it is read. make test's race run once saw a stream's consume refused
// with PRECONDITION_FAILED ("does not have a replica on the local node"),
// no member of the stream running on the node at that moment, which
// ReadStream now waits out; this test did not bring that refusal about
// here (240 runs, with and without CPU load beside it), so it guards the
// read right after a declare, not the retry (TestStreamConsumeTransient).
func TestReadStreamRightAfterItsDeclare(t *testing.T) {
	t.Parallel()
	writer, reader := dial(t), dial(t)
	ch := channel(t, writer)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 30 {
		name := fmt.Sprintf("ferry.test.stream.%s.%d", ferrytest.Suffix(), i)
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeStream}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if c, err := writer.Channel(); err == nil {
				_, _ = c.QueueDelete(name, false, false, false)
				_ = c.Close()
			}
		})
		if err := ch.PublishWithContext(ctx, "", name, false, false, amqp.Publishing{Body: []byte("m")}); err != nil {
			t.Fatal(err)
		}
		var got int
		if err := rabbitmq.ReadStream(ctx, reader, name, time.Second, func(*amqp.Delivery) bool { got++; return false }); err != nil {
			t.Fatalf("stream %d of 30: %v", i+1, err)
		}
		if got != 1 {
			t.Fatalf("stream %d of 30: read %d messages, want 1", i+1, got)
		}
	}
}
