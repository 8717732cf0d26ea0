//go:build faults

package inbox

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// A handler that ignores its context wedges its lane: the handler timeout
// cannot end it. Liveness reports it once a transaction has run for the
// limit, and recovers once the call returns and its transaction commits.
//
// It runs in the serial fault phase: the wedged transaction holds an xid
// for longer than the limit, and creating a logical slot anywhere in the
// cluster (the relay tests) waits for every open xid.
func TestFaultWedgedHandlerFailsLiveness(t *testing.T) {
	b := setup(t, 1)
	entered := make(chan struct{})
	unblock := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(unblock) }) }
	defer release()
	first := true
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if first {
			first = false
			if err := effectHandler(ctx, tx, m); err != nil {
				return err
			}
			close(entered)
			<-unblock // ignores ctx
			return nil
		}
		return effectHandler(ctx, tx, m)
	}
	w := b.newWorker(b.healthConfig(), h)
	b.start(w)
	b.produce(b.record("m-1", "k", 0, 1))
	<-entered
	if err := w.Healthy(); err != nil {
		t.Fatalf("unhealthy as soon as a handler started: %v", err)
	}
	b.waitFor("liveness to report the wedged handler", func() (bool, error) { return w.Healthy() != nil, nil })
	if err := w.Healthy(); !strings.Contains(err.Error(), "a transaction has run for") {
		t.Fatalf("Healthy: %v, want it to name the long transaction", err)
	}
	release()
	b.waitFor("m-1 applied", func() (bool, error) { return b.effects("m-1") == 1, nil })
	b.waitFor("liveness to recover", func() (bool, error) { return w.Healthy() == nil, nil })
}

// An idle worker's readiness follows Kafka and PostgreSQL: red (naming
// which) while one does not answer, green once it is back. Its poll and its
// transactions alone would not notice: an idle worker runs neither.
func TestFaultWorkerReadinessFollowsKafkaAndPostgreSQL(t *testing.T) {
	b := setup(t, 1)
	w := b.newWorker(b.config(), effectHandler)
	b.start(w)
	ready := func(want string) {
		t.Helper()
		b.waitFor("Ready "+want, func() (bool, error) {
			err := w.Ready()
			return (want == "" && err == nil) || (want != "" && err != nil && strings.Contains(err.Error(), want)), nil
		})
	}
	ready("")
	for _, svc := range []struct{ stop, start, says string }{
		{"kafka-stop", "kafka-start", "Kafka has not answered"},
		{"pg-stop", "pg-start", "PostgreSQL has not answered"},
	} {
		ferrytest.Stack(t, svc.stop)
		down := true
		t.Cleanup(func() {
			if down {
				ferrytest.Stack(t, svc.start)
			}
		})
		ready(svc.says)
		ferrytest.Stack(t, svc.start)
		down = false
		ready("")
	}
}
