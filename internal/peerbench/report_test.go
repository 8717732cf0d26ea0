package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func spliceFile(t *testing.T, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "benchmarks.md")
	if content != "" {
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return file
}

func read(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSpliceReplacesOnlyWhatIsBetweenTheMarkers(t *testing.T) {
	t.Parallel()
	before := "# Benchmarks\n\nmake bench's tables\n\n"
	after := "\ntrailing text\n"
	file := spliceFile(t, before+beginMarker+"\nold peers\n"+endMarker+after)
	if err := splice(file, "new peers\n"); err != nil {
		t.Fatal(err)
	}
	want := before + beginMarker + "\nnew peers\n" + endMarker + after
	if got := read(t, file); got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}

func TestSpliceAppendsTheMarkedSectionWhenTheFileHasNone(t *testing.T) {
	t.Parallel()
	file := spliceFile(t, "# Benchmarks\nno newline at the end")
	if err := splice(file, "peers\n"); err != nil {
		t.Fatal(err)
	}
	want := "# Benchmarks\nno newline at the end\n\n" + beginMarker + "\npeers\n" + endMarker + "\n"
	if got := read(t, file); got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	// A second run replaces the section instead of appending another.
	if err := splice(file, "peers again\n"); err != nil {
		t.Fatal(err)
	}
	if got := read(t, file); strings.Count(got, beginMarker) != 1 || !strings.Contains(got, "peers again") {
		t.Fatalf("second splice: %q", got)
	}
}

func TestSpliceRefusesAFileWithOneMarker(t *testing.T) {
	t.Parallel()
	file := spliceFile(t, "text\n"+endMarker+"\n")
	if err := splice(file, "peers\n"); err == nil {
		t.Fatal("splice into a file with only the end marker succeeded")
	}
	if got := read(t, file); got != "text\n"+endMarker+"\n" {
		t.Fatalf("the file changed: %q", got)
	}
}

// namedPeer is a peer for the report: only its name and texts are read.
type namedPeer struct {
	peer
	name string
}

func (p namedPeer) Name() string     { return p.name }
func (p namedPeer) Marks() string    { return "marks" }
func (p namedPeer) Settings() string { return "settings\n" }

// Each figure is the median and range of the rounds, and each ratio to
// Ferry's is taken within a round: in the second round both peers drained
// half as fast, which leaves the ratio where it was. The same holds for
// each fixed rate's CPU, its own and the broker's, and for the
// one-event-per-transaction drain, each
// in a table of its own.
func TestReportGivesMediansAndRatiosPairedByRound(t *testing.T) {
	t.Parallel()
	ferry, other := namedPeer{name: "Ferry relay"}, namedPeer{name: "Other"}
	res := func(p peer, inKafka time.Duration) *result {
		k := float64(inKafka) / float64(time.Second) // the round's slowness
		r := &result{peer: p, events: 1000, inKafka: inKafka, confirmed: inKafka, ready: 0}
		for _, rate := range []int{1000, 5000} {
			r.rates = append(r.rates, &result{peer: p, rate: rate, achieved: float64(rate), rateCPU: 0.01 * k * float64(rate) / 1000,
				brokerCPU: 0.1 * k})
		}
		r.onePerTx = &result{peer: p, events: 500, inKafka: 2 * inKafka, confirmed: 2 * inKafka}
		return r
	}
	rounds := [][]*result{
		{res(ferry, 1*time.Second), res(other, 5*time.Second)},
		{res(ferry, 2*time.Second), res(other, 10*time.Second)},
		{res(ferry, 1*time.Second), res(other, 6*time.Second)},
	}
	md := markdown(rounds, opts{events: 1000, onePerTx: 500, rates: []int{1000, 5000}, latencyFor: time.Second}, nil, nil, time.Now(), time.Second, "")
	for _, want := range []string{
		"| whole backlog in Kafka, after process start | 1.00 (1.00–2.00) s | 6.00 (5.00–10.00) s |",
		"| drain time / Ferry's, from start (how many times faster Ferry drains) | **1.00** | **5.00 (5.00–6.00)** |",
		"median (min–max) of 3 rounds",
		"### Latency at 5000 events/s for 1s",
		"| **CPU of the process (cores busy)** | 0.050 (0.050–0.100) | 0.300 (0.250–0.500) |",
		"| CPU / Ferry's | **1.00** | **5.00 (5.00–6.00)** |",
		"| broker CPU / with Ferry's | **1.00** | **5.00 (5.00–6.00)** |",
		"### Backlog drain: 500 events written one per transaction",
		"| whole backlog in Kafka, after process start | 2.00 (2.00–4.00) s | 12.00 (10.00–20.00) s |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

func TestSpliceRabbitMQLeavesTheKafkaSection(t *testing.T) {
	t.Parallel()
	kafka := beginMarker + "\nkafka peers\n" + endMarker + "\n"
	file := spliceFile(t, "# Benchmarks\n\n"+kafka)
	if err := spliceBetween(file, rabbitBeginMarker, rabbitEndMarker, "rabbitmq peers\n"); err != nil {
		t.Fatal(err)
	}
	want := "# Benchmarks\n\n" + kafka + "\n" + rabbitBeginMarker + "\nrabbitmq peers\n" + rabbitEndMarker + "\n"
	if got := read(t, file); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	if err := splice(file, "new kafka peers\n"); err != nil {
		t.Fatal(err)
	}
	if got := read(t, file); !strings.Contains(got, "rabbitmq peers") || !strings.Contains(got, "new kafka peers") {
		t.Errorf("the Kafka splice lost the RabbitMQ section:\n%s", got)
	}
}
