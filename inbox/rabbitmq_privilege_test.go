package inbox

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// The permissions docs/rabbitmq.md gives a worker: everything under
// outbox., nothing else.
const (
	workerConfigure = `^outbox\.`
	workerWrite     = `^outbox\.`
	workerRead      = `^outbox\.`
)

// TestRabbitLeastPrivilegeWorker runs a worker as a user with only the
// permissions the docs give it, on a topic whose topology does not exist
// yet: it declares its exchanges, stream and shard queues, applies the
// events and writes a dead letter. A permission the docs forgot fails the
// start-up or the dead letter; one too many would not be seen here, so the
// relay's user has its own test (relay's TestRabbitMQOverTLSAsTheRelayUser).
func TestRabbitLeastPrivilegeWorker(t *testing.T) {
	t.Parallel()
	b := setupRabbit(t, nil)
	b.deleteTopology() // the worker declares it, as its own user
	user := ferrytest.Name(t, "worker")
	password := "pw-" + ferrytest.Suffix()
	if _, err := ferrytest.RabbitMQManagement(t, "PUT", "/api/users/"+url.PathEscape(user), map[string]string{"password": password, "tags": ""}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ferrytest.RabbitMQManagement(t, "DELETE", "/api/users/"+url.PathEscape(user), nil) })
	if _, err := ferrytest.RabbitMQManagement(t, "PUT", "/api/permissions/ferry/"+url.PathEscape(user),
		map[string]string{"configure": workerConfigure, "write": workerWrite, "read": workerRead}); err != nil {
		t.Fatal(err)
	}
	cfg := b.config()
	u, err := url.Parse(cfg.RabbitMQ.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	cfg.RabbitMQ.URL, cfg.RabbitMQ.Password = u.String(), password

	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	poison := b.consumer + "-k0-2"
	w.Handle(b.consumer, b.topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == poison {
			return Permanent(errors.New("refused for good"))
		}
		return effectHandler(ctx, tx, m)
	})
	stop := b.start(w)
	waitReady(t, w)
	want := b.events(4, 5)
	b.waitEffects(want - 1)
	if dls := b.deadLetters(1); len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := b.queued(); n != 0 {
		t.Errorf("%d messages left in the queues", n)
	}
}
