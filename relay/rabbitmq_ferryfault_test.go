//go:build faults && ferryfault

package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/relay"
)

// The negative control --unsafe-confirm-on-send on RabbitMQ: the relay
// counts a publish as acknowledged once written, so it confirms WAL the
// broker never stored (a memory alarm keeps the broker from reading), and
// a broker killed then loses those events for good. The check must see
// the loss; TestFaultRabbitMQMemoryAlarmBlocksThenDrains is the same
// scenario with the defence, and loses nothing.
func TestFaultRabbitMQNegativeControlConfirmOnSendLoses(t *testing.T) {
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	cfg := b.cfg
	relay.UnsafeRabbitMQConfirmOnSend(&cfg)
	r := b.start(t, cfg)
	before := b.writeAggregates(t, "order", 5, 0, 5)
	b.waitConfirmed(t, 30*time.Second)

	clear := memoryAlarm(t)
	held := b.slotConfirmedLSN(t)
	during := b.writeAggregates(t, "order", 10, 100, 20)
	deadline := time.Now().Add(30 * time.Second)
	for r.Ready() == nil || !strings.Contains(r.Ready().Error(), "blocked") {
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want the block", r.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.waitConfirmed(t, 30*time.Second) // confirmed without a single confirm
	if c := b.slotConfirmedLSN(t); c <= held {
		t.Fatalf("confirmed_flush_lsn %s did not move: the control does not confirm on send", c)
	}
	sessions := r.Stats().Sessions
	ferrytest.Stack(t, "rabbitmq-kill")
	ferrytest.Stack(t, "rabbitmq-start")
	clear()
	// The relay has nothing left to send (it confirmed everything on
	// send): what the broker lost is lost. It is ready again once it saw
	// its blocked connection die, with no stale block in Ready.
	deadline = time.Now().Add(time.Minute)
	for r.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("Ready a minute after the broker's restart, with nothing to publish: %v", r.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := r.Stats().Sessions; s != sessions {
		t.Logf("%d sessions before the broker's restart, %d after", sessions, s)
	}
	got := drainRabbit(t, topic)
	lost := got.missing(append(before, during...))
	if lost == 0 {
		t.Fatal("the negative control lost nothing: the check cannot see a confirm-on-send relay")
	}
	t.Logf("negative control: %d of %d events lost, as it must", lost, len(before)+len(during))
}
