//go:build faults

package inbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// A delivery held past the broker's consumer timeout (a handler stuck, a
// retry that waits out a PostgreSQL outage): the broker closes the channel
// and redelivers what it held. The worker must take it as a lost channel
// (no ack of it on any other channel) and the inbox keep the effect single:
// a duplicate, never a loss, never two effects.
//
// RabbitMQ 3.10 checks the timeout on its channel tick (every 60 s by
// default, and not at all while a channel hibernates); the test ticks every
// 500 ms with a 5 s timeout, for channels opened meanwhile. It changes the
// broker's settings and holds a transaction open, so it runs in the serial
// fault phase.
func TestFaultRabbitConsumerTimeoutRedelivers(t *testing.T) {
	ferrytest.RabbitMQCtl(t, "eval", "application:set_env(rabbit, channel_tick_interval, 500), application:set_env(rabbit, consumer_timeout, 5000).")
	t.Cleanup(func() {
		ferrytest.RabbitMQCtl(t, "eval", "application:set_env(rabbit, channel_tick_interval, 60000), application:set_env(rabbit, consumer_timeout, 1800000).")
	})
	b := setupRabbit(t, func(c *RabbitMQConfig) { c.Shards = 1 })
	want := b.events(2, 5)
	cfg := b.config()
	cfg.HandlerTimeout = 5 * time.Minute // the broker's timeout, not Ferry's, must end the hold
	w, _ := New(cfg)
	release := make(chan struct{})
	var once sync.Once
	held := b.consumer + "-k0-1"
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == held {
			var first bool
			once.Do(func() { first = true })
			if first {
				select { // hold the delivery past the consumer timeout
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	started := time.Now()
	deadline := started.Add(2 * time.Minute)
	for w.Stats().PartitionsLost == 0 {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("the broker never closed the channel holding a delivery past its 5 s consumer timeout; stats %+v", w.Stats())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("channel closed by the broker %s after the start", time.Since(started).Round(100*time.Millisecond))
	close(release)
	b.waitEffects(want)
	// The effects are all there once the held handler commits, but the
	// broker requeued what the closed channel held, and the worker takes
	// it again only after its reconnect backoff: wait for that before the
	// stop, which leaves unacknowledged whatever it has not taken yet.
	for w.Stats().Redelivered == 0 || b.queued() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the requeued deliveries were not taken again and acknowledged: stats %+v, %d queued", w.Stats(), b.queued())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.check(want)
	if st := w.Stats(); st.Redelivered == 0 {
		t.Errorf("stats %+v: want the held delivery redelivered", st)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
}
