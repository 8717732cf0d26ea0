//go:build faults

package inbox

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
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
