//go:build faults

package relay_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// An idle relay (nothing in flight) still knows whether Kafka answers: it
// pings the broker when no acknowledgement came for --server-timeout, and
// /readyz turns red while the broker is down and green once it is back.
func TestFaultIdleRelayReadinessFollowsKafka(t *testing.T) {
	b := setup(t)
	r := b.start(t, b.cfg)
	waitReady(t, r, "")
	ferrytest.Stack(t, "kafka-stop")
	stopped := true
	t.Cleanup(func() {
		if stopped {
			ferrytest.Stack(t, "kafka-start")
		}
	})
	waitReady(t, r, "Kafka has not answered")
	ferrytest.Stack(t, "kafka-start")
	stopped = false
	waitReady(t, r, "")
}
