package relay_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
