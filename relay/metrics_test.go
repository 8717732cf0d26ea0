package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// ferry_relay_ready follows Ready, and ferry_relay_slot_active says that a
// process holds the slot, as both the active relay and its standby see it:
// what the alerts on a relay not ready and a slot not active read.
func TestReadyAndSlotActiveGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "order", 1)

	idle := b.cfg
	idle.Registerer = prometheus.NewRegistry()
	if _, err := relay.New(&idle); err != nil {
		t.Fatal(err)
	}
	if v := gaugeValue(t, idle.Registerer.(*prometheus.Registry), "ferry_relay_ready"); v != 0 {
		t.Errorf("ferry_relay_ready of a relay not started = %v, want 0", v)
	}

	regActive, regStandby := prometheus.NewRegistry(), prometheus.NewRegistry()
	cfg := b.cfg
	cfg.WALMonitorInterval = 100 * time.Millisecond
	cfg.Registerer = regActive
	b.start(t, cfg)
	cfg.Registerer = regStandby
	standby := b.startStandby(t, cfg)

	want := []struct {
		reg  *prometheus.Registry
		name string
	}{
		{regActive, "ferry_relay_ready"}, {regActive, "ferry_relay_slot_active"},
		{regStandby, "ferry_relay_ready"}, {regStandby, "ferry_relay_slot_active"}, {regStandby, "ferry_relay_standby"},
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, w := range want {
		for gaugeValue(t, w.reg, w.name) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s stays %v, want 1 (standby state %s)", w.name, gaugeValue(t, w.reg, w.name), standby.State())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if v := gaugeValue(t, regActive, "ferry_relay_standby"); v != 0 {
		t.Errorf("the active relay's ferry_relay_standby = %v, want 0", v)
	}
}

// gaugeValue reads the one series of gauge name from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s: no single series in the registry", name)
	return 0
}

// The counters that say where a relay's wake-ups go follow the stream:
// every transaction of one event brings at least three WAL messages
// (begin, insert, commit), brought by at least one read of the socket and
// at most one read per message; the position is confirmed by status
// updates, and the events went to Kafka in produce requests.
func TestWakeUpCountersFollowTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "order", 2)
	cfg := b.cfg
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := b.start(t, cfg)
	const n = 40
	for i := range n {
		b.write(t, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%5), EventType: "Placed", Payload: []byte("{}")})
	}
	waitStats(t, r, n)
	wal := counterValue(t, reg, "ferry_relay_replication_messages_total", "kind", "wal")
	reads := counterValue(t, reg, "ferry_relay_replication_reads_total", "", "")
	updates := counterValue(t, reg, "ferry_relay_status_updates_total", "", "")
	produces := counterValue(t, reg, "ferry_relay_kafka_produce_requests_total", "", "")
	t.Logf("%d events: %v WAL messages, %v reads, %v status updates, %v produce requests", n, wal, reads, updates, produces)
	if wal < 3*n {
		t.Errorf("%v WAL messages for %d transactions of one event: want at least %d", wal, n, 3*n)
	}
	if reads < 1 || reads > wal+counterValue(t, reg, "ferry_relay_replication_messages_total", "kind", "keepalive")+10 {
		t.Errorf("%v reads of the socket for %v messages: want at least one, at most one per message (and the start-up's)", reads, wal)
	}
	if updates < 1 || produces < 1 {
		t.Errorf("%v status updates, %v produce requests for %d events: want some of each", updates, produces, n)
	}
}

// counterValue reads counter name from reg: its series with label = value,
// or its one series when label is empty.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" && len(mf.GetMetric()) == 1 {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{%s=%q}: no such series in the registry", name, label, value)
	return 0
}

// The read window gathers what arrives after a read that emptied the
// socket: transactions committed about a millisecond apart reach a relay
// with a 10 ms window in at most one read per window (and a few around
// it), however slowly a loaded machine commits them, and one without it in
// about one read each. 10 ms: while records are in flight the relay's read
// deadline (its prompt status update, 10 ms) also ends a longer window, so
// a 20 ms one gathered for 10 ms on a loaded machine, more reads than it
// allows (14 in 210 ms in a make test).
func TestReadWindowGathersTransactions(t *testing.T) {
	t.Parallel()
	const n, window = 40, 10 * time.Millisecond
	reads := func(window time.Duration) (float64, time.Duration) {
		b := setup(t)
		b.topic(t, "order", 2)
		cfg := b.cfg
		reg := prometheus.NewRegistry()
		cfg.Registerer, cfg.ReadWindow = reg, window
		r := b.start(t, cfg)
		b.write(t, outbox.Event{AggregateType: "order", AggregateID: "warm-up", EventType: "Placed", Payload: []byte("{}")})
		waitStats(t, r, 1)
		before := counterValue(t, reg, "ferry_relay_replication_reads_total", "", "")
		start := time.Now()
		for i := range n {
			b.write(t, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%5), EventType: "Placed", Payload: []byte("{}")})
			time.Sleep(time.Millisecond) // a pace, not a wait for anything
		}
		waitStats(t, r, n+1)
		return counterValue(t, reg, "ferry_relay_replication_reads_total", "", "") - before, time.Since(start)
	}
	with, took := reads(window)
	without, tookWithout := reads(relay.ReadWindowOff)
	t.Logf("%d transactions about a millisecond apart: %v reads in %s with a %s window, %v in %s without", n, with, took.Round(time.Millisecond), window, without, tookWithout.Round(time.Millisecond))
	most := float64(took/window) + 3
	if with > most {
		t.Errorf("%v reads in %s with a %s window: want at most one per window, %v", with, took.Round(time.Millisecond), window, most)
	}
	// The control: without the window the same load takes more reads than
	// the window allows, when the transactions came close enough together
	// for a window to gather two or more.
	if most < n/2 && without <= most {
		t.Errorf("%v reads without a window, at most %v allowed with one: the window should be what gathers them", without, most)
	}
}

// waitStats waits until r published n events.
func waitStats(t *testing.T, r *relay.Relay, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for r.Stats().Published < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events published", r.Stats().Published, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
