package inbox

import (
	"testing"
	"time"
)

// healthConfig is the shortest liveness limit the validation allows with
// a 1 s handler timeout: a transaction may run HandlerTimeout + 10 s, the
// commit loop may wait 2 x 10 s behind offset commits.
func (b *bundle) healthConfig() *Config {
	cfg := b.config()
	cfg.HandlerTimeout = time.Second
	cfg.HealthTimeout = 21 * time.Second
	return cfg
}

// An idle worker is healthy: its poll loop waits for records for longer
// than the liveness limit, and that is not a wedge.
func TestIdleWorkerStaysHealthy(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	w := b.newWorker(b.healthConfig(), effectHandler)
	b.start(w)
	b.waitFor("the worker to join its group", func() (bool, error) { return w.Ready() == nil, nil })
	until := time.Now().Add(w.cfg.HealthTimeout + 2*time.Second)
	for time.Now().Before(until) {
		if err := w.Healthy(); err != nil {
			t.Fatalf("an idle worker reported unhealthy: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
