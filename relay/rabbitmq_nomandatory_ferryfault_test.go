//go:build ferryfault

package relay_test

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/relay"
)

// The negative control --unsafe-no-mandatory: an event no queue is bound
// for is acknowledged by the broker and dropped; the relay confirms it and
// nothing holds or quarantines it. The check must see that loss, which
// TestRabbitMQUnroutableIsHeldThenQuarantined shows the defence prevents.
func TestRabbitMQNegativeControlNoMandatoryLoses(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	topic := b.prefix + ".unbound"
	admin, err := rabbitAdmin(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := rabbitmq.DeclareExchange(admin, topic, ""); err != nil {
		t.Fatal(err)
	}
	cfg := b.cfg
	relay.UnsafeRabbitMQNoMandatory(&cfg)
	r := b.start(t, cfg)
	ids := b.write(t, evt("unbound", "a", 0), evt("unbound", "a", 1))
	b.waitConfirmed(t, 30*time.Second)
	q, err := relay.ListQuarantined(b.ctx, b.db.Pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 0 || r.Ready() != nil {
		t.Fatalf("the control held or quarantined the events (%d quarantined, Ready %v): it does not drop them", len(q), r.Ready())
	}
	declare(t, topic) // too late: the events are gone
	if got := drainRabbit(t, topic); got.missing(ids) != len(ids) {
		t.Fatalf("%d of %d events arrived without mandatory", len(ids)-got.missing(ids), len(ids))
	}
	t.Logf("negative control: %d events confirmed, none delivered, none quarantined", len(ids))
}
