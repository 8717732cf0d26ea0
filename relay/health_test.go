package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// wedgedSink never returns from Produce: a client call that hangs.
type wedgedSink struct{ release chan struct{} }

func (s wedgedSink) Produce(ctx context.Context, _ *kgo.Record, _ func(*kgo.Record, error)) {
	<-s.release
}

func (wedgedSink) AbortBufferedRecords(context.Context) error { return nil }

// Liveness means progress: an idle relay stays healthy however long it
// waits, and a relay whose loop hangs in a call that never returns turns
// unhealthy after Config.HealthTimeout, so a liveness probe restarts it.
func TestHealthyReportsAWedgedLoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := wedgedSink{release: make(chan struct{})}
	cfg := b.cfg
	cfg.Sink = sink
	cfg.ReconnectBackoffMax = time.Second
	cfg.HealthTimeout = 2 * time.Second
	cfg.ShutdownTimeout = time.Second // the hung record is never acknowledged
	r := b.start(t, cfg)
	t.Cleanup(func() { close(sink.release) }) // before the relay stops (cleanups run last first)

	idleUntil := time.Now().Add(2 * cfg.HealthTimeout)
	for time.Now().Before(idleUntil) {
		if err := r.Healthy(); err != nil {
			t.Fatalf("an idle, streaming relay is unhealthy: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	b.write(t, evt("order", "o", 1)) // Produce never returns
	deadline := time.Now().Add(time.Minute)
	for {
		err := r.Healthy()
		if err != nil && strings.Contains(err.Error(), "wedged") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Healthy() = %v a minute after the loop hung, want a wedged relay", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Readiness: the active relay and a standby are both ready (a rolling
// update waits for a new standby, never for it to take the slot); only the
// active one is Active.
func TestReadyAndActiveForActiveAndStandby(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "order", 1)
	active := b.start(t, b.cfg)
	standby := b.startStandby(t, b.cfg)
	if err := active.Ready(); err != nil {
		t.Errorf("active relay not ready: %v", err)
	}
	if err := active.Active(); err != nil {
		t.Errorf("active relay not active: %v", err)
	}
	if err := standby.Ready(); err != nil {
		t.Errorf("standby not ready: %v", err)
	}
	if err := standby.Active(); err == nil || !strings.Contains(err.Error(), "standby") {
		t.Errorf("standby Active() = %v, want an error saying it stands by", err)
	}
	if err := standby.Healthy(); err != nil {
		t.Errorf("standby unhealthy: %v", err)
	}
}
