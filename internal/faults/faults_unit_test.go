package faults

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEventBodyRoundTripIgnoresPadding(t *testing.T) {
	t.Parallel()
	in := eventBody{Kind: KindVersioned, Aggregate: aggregateName(7), Version: 42}
	out, err := decodeBody(encodeBody(in, []byte{0xff, 0x00, '{'}))
	if err != nil || out != in {
		t.Fatalf("decode = %+v, %v; want %+v", out, err, in)
	}
	for _, bad := range []string{"", "not json", `{"k":"versioned"}`, `{"a":"agg-0001"}`} {
		if _, err := decodeBody([]byte(bad)); err == nil {
			t.Errorf("decodeBody(%q) accepted", bad)
		}
	}
	if aggregateName(7) != "agg-0007" {
		t.Fatalf("aggregateName(7) = %q; schema.go seeds 'agg-' || lpad(i, 4, '0')", aggregateName(7))
	}
}

func TestParseWorkerMetricsSumsConsumersAndTopics(t *testing.T) {
	t.Parallel()
	metrics := `# HELP ferry_worker_duplicates_skipped_total Messages already in the inbox.
# TYPE ferry_worker_duplicates_skipped_total counter
ferry_worker_duplicates_skipped_total{consumer="a",topic="t"} 3
ferry_worker_duplicates_skipped_total{consumer="b",topic="t"} 4
ferry_worker_messages_processed_total{consumer="a",topic="t"} 100
ferry_worker_messages_processed_total{consumer="b",topic="t"} 1e+06
ferry_worker_retries_total{consumer="a",topic="t"} 9
ferry_worker_redelivered_total{consumer="a",topic="t"} 11
ferry_worker_redelivered_total{consumer="b",topic="t"} 1
`
	dup, processed, red, err := parseWorkerMetrics(strings.NewReader(metrics))
	if err != nil || dup != 7 || processed != 1_000_100 || red != 12 {
		t.Fatalf("parse = %v, %v, %v, %v; want 7, 1000100, 12", dup, processed, red, err)
	}
	if _, _, _, err := parseWorkerMetrics(strings.NewReader(`ferry_worker_duplicates_skipped_total{consumer="a"} x`)); err == nil {
		t.Fatal("a malformed value parsed")
	}
}

func TestWorkerCountersSurviveRestarts(t *testing.T) {
	t.Parallel()
	w := &workerProc{curDup: 5, curProc: 50}
	w.rollover()
	w.curDup, w.curProc = 2, 20
	if dup, proc := w.counters(); dup != 7 || proc != 70 {
		t.Fatalf("counters = %v, %v; want 7, 70", dup, proc)
	}
}

func TestACleanReportPassesAndAnUndrainedOneFails(t *testing.T) {
	t.Parallel()
	r := &Report{Title: "t", Drained: true, Consumers: []ConsumerFigures{{Consumer: "c", Effects: 10, Applied: 10}},
		Committed: CommittedFigures{Events: 10, Versioned: 10, LatestVersions: 10},
		Faults:    []Fault{{Kind: FaultPGRestart, At: time.Second, Healed: 2 * time.Second}}}
	if !r.OK() {
		t.Fatalf("clean report fails: %q", r.Violations())
	}
	if md := r.Markdown(); !strings.Contains(md, "PASS") || !strings.Contains(md, "pg-restart-immediate ×1") {
		t.Fatalf("markdown:\n%s", md)
	}
	r.Drained = false
	if r.OK() {
		t.Fatal("a run that did not drain passes")
	}
	r.Drained, r.Consumers = true, nil
	if r.OK() {
		t.Fatal("a run that checked no consumer passes")
	}
	r.Consumers = []ConsumerFigures{{Consumer: "c"}}
	r.Committed.LatestVersions = 9
	if r.OK() {
		t.Fatal("versions that do not add up pass")
	}
}

// A negative control is caught only by a run that drained and in which the
// checker reported the loss: on a run that never finished draining, events
// still on their way count as lost, and the checker's verdict means nothing.
func TestAControlIsCaughtOnlyWhenItsRunDrained(t *testing.T) {
	t.Parallel()
	r := &Report{Title: "control", Drained: true, Consumers: []ConsumerFigures{{Consumer: "c", Effects: 840, Lost: 160}},
		Committed: CommittedFigures{Events: 1000}}
	if err := r.ControlCaught(); err != nil {
		t.Fatalf("a drained control with 160 lost events is not caught: %v", err)
	}
	r.Drained = false
	if r.ControlCaught() == nil {
		t.Error("a control whose run did not drain counts as caught")
	}
	r.Drained, r.Consumers = true, []ConsumerFigures{{Consumer: "c", Effects: 1000}}
	if r.ControlCaught() == nil {
		t.Error("a control in which the checker reported nothing lost counts as caught")
	}
}

func TestRabbitMQOptionsRefuseKafkaOnlyFaults(t *testing.T) {
	t.Parallel()
	o := RabbitMQShort()
	o.Bins, o.WorkDir = Binaries{Relay: "r", Faults: "f"}, t.TempDir()
	o.withDefaults()
	if err := o.validate(); err != nil {
		t.Fatalf("RabbitMQShort: %v", err)
	}
	o.Kinds = []FaultKind{FaultSlotDrop}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "slot-drop-recover") {
		t.Fatalf("slot-drop-recover on RabbitMQ: err = %v, want a refusal naming it", err)
	}
	o.Kinds, o.Shards = RabbitMQFaults, 6
	if err := o.validate(); err == nil {
		t.Fatal("6 shards accepted: the relay wants a power of two")
	}
	k := Short()
	k.withDefaults()
	if k.Broker != BrokerKafka || !slices.Equal(k.Kinds, AllFaults) {
		t.Fatalf("Short: broker %q, kinds %v; want kafka and AllFaults", k.Broker, k.Kinds)
	}
}

func TestOrderControlCaughtWantsInversionsOnADrainedRun(t *testing.T) {
	t.Parallel()
	r := &Report{Broker: BrokerRabbitMQ, Drained: true, Consumers: []ConsumerFigures{{Consumer: "c", Effects: 10, Applied: 10}}}
	if r.OrderControlCaught() == nil {
		t.Fatal("no inversion, yet caught")
	}
	r.Consumers[0].Inversions = 3
	if err := r.OrderControlCaught(); err != nil {
		t.Fatalf("3 inversions: %v", err)
	}
	r.Drained = false
	if r.OrderControlCaught() == nil {
		t.Fatal("an undrained run caught")
	}
	if md := r.Markdown(); !strings.Contains(md, "cannot be read again") || strings.Contains(md, "duplicates delivered by Kafka") {
		t.Fatalf("a RabbitMQ report speaks of a topic scan:\n%s", md)
	}
}
