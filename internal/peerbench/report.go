package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/stats"
)

// The markers that bound this report's section of docs/benchmarks.md; the
// rest of the file belongs to `make bench`.
const (
	beginMarker = "<!-- bench-peers:begin -->"
	endMarker   = "<!-- bench-peers:end -->"
)

// versions lists what ran, name then version, in order.
func versions(ctx context.Context, b *bench, admin string) [][2]string {
	var vs [][2]string
	add := func(name, v string) { vs = append(vs, [2]string{name, v}) }
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		add("Ferry", "commit "+strings.TrimSpace(string(out)))
	}
	add("Go", runtime.Version())
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/twmb/franz-go" || d.Path == "github.com/jackc/pgx/v5" {
				add(d.Path+" (Ferry's relay and this driver)", d.Version)
			}
		}
	}
	pg := "unknown"
	if conn, err := pgx.Connect(ctx, admin); err == nil {
		_ = conn.QueryRow(ctx, `SELECT 'PostgreSQL ' || current_setting('server_version')`).Scan(&pg)
		conn.Close(ctx)
	}
	add("PostgreSQL", pg)
	add("Kafka broker", "Apache Kafka "+cmpOr(os.Getenv("FERRY_TEST_KAFKA_VERSION"), "unknown")+" (one KRaft broker, scripts/stack)")
	if b.java != "" {
		if out, err := exec.Command(b.java, "-version").CombinedOutput(); err == nil {
			add("Java", strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
		}
	}
	if b.debeziumLib != "" {
		jars, _ := filepath.Glob(filepath.Join(b.debeziumLib, "*.jar"))
		re := regexp.MustCompile(`^(debezium-connector-postgres|debezium-connect-plugins|connect-runtime|kafka-clients|postgresql)-([0-9].*)\.jar$`)
		for _, j := range jars {
			if m := re.FindStringSubmatch(filepath.Base(j)); m != nil {
				add(m[1]+" (Debezium's JVM)", m[2])
			}
		}
	}
	if b.watermill != "" {
		if out, err := exec.Command(b.watermill, "versions").Output(); err == nil {
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			sc.Scan() // the Go version, the same as the driver's
			for sc.Scan() {
				if path, v, ok := strings.Cut(sc.Text(), " "); ok {
					add(path+" (watermill-peer)", v)
				}
			}
		}
	}
	return vs
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func machine() [][2]string {
	var vs [][2]string
	cpu, mem := "unknown", "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				fmt.Sscanf(strings.TrimSpace(rest), "%f", &kb)
				mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	kernel := "unknown"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = "Linux " + strings.TrimSpace(string(b))
	}
	return append(vs, [2]string{"CPU", cpu}, [2]string{"cores (nproc)", fmt.Sprint(runtime.NumCPU())},
		[2]string{"memory", mem}, [2]string{"kernel", kernel})
}

// markdown is the section between the markers: every figure is the median
// (min–max) over the rounds, every ratio to Ferry's is taken within each
// round and then summarised the same way.
func markdown(rounds [][]*result, o opts, vs, mach [][2]string, started time.Time, took time.Duration, note string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	rs := rounds[0] // the peers, in order; the same in every round
	col := func(i int, f func(r *result) float64) stats.Samples {
		var s stats.Samples
		for _, round := range rounds {
			s = append(s, f(round[i]))
		}
		return s
	}
	row := func(label, verb, unit string, f func(r *result) float64) {
		w("| %s |", label)
		for i := range rs {
			w(" %s%s |", col(i, f).Format(verb), unit)
		}
		w("\n")
	}
	ratioRow := func(label string, f func(r *result) float64) {
		w("| %s |", label)
		w(" **1.00** |") // Ferry's to its own
		for i := range rs[1:] {
			w(" **%s** |", stats.Ratios(col(i+1, f), col(0, f)).Format("%.2f"))
		}
		w("\n")
	}
	header := func() {
		w("| figure (median (min–max) of %d rounds) |", len(rounds))
		for _, r := range rs {
			w(" %s |", r.peer.Name())
		}
		w("\n|---|")
		for range rs {
			w("---|")
		}
		w("\n")
	}
	sec := func(d time.Duration) float64 { return d.Seconds() }
	msec := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	w("## Peers: Ferry's relay, Debezium and Watermill side by side\n\n")
	w("Written by `make bench-peers` (`scripts/bench-peers`: `go run ./internal/peerbench -out docs/benchmarks.md`) on %s, in %s.\n",
		started.UTC().Format("2006-01-02 15:04 UTC"), took.Round(time.Second))
	if note != "" {
		w("\n**%s**\n", note)
	}
	w("\nEach peer ran as a process of its own, one after the other, against the same PostgreSQL and the same Kafka broker\n"+
		"(`scripts/stack`), each with a database and a topic of its own (topic per aggregate type, "+
		"%d partitions, key = aggregate id), the same %d-byte payloads on 1,000 aggregates. Ferry's relay and Debezium read\n"+
		"Ferry's outbox table through a logical replication slot (pgoutput) made before the backlog was written; Watermill's\n"+
		"forwarder reads a table of its own, so its events were written through Watermill's own SQL publisher (wrapped by the\n"+
		"forwarder's publisher): the same count, payload, key and event headers, in one transaction for the backlog.\n"+
		"%d rounds ran, each of them every peer in turn on a new database, slot and topic; a ratio is taken within each round.\n\n",
		rs[0].partitions, rs[0].payloadBytes, len(rounds))
	w("| machine | |\n|---|---|\n")
	for _, m := range mach {
		w("| %s | %s |\n", m[0], m[1])
	}
	w("\n| software | version |\n|---|---|\n")
	for _, v := range vs {
		w("| %s | %s |\n", v[0], v[1])
	}
	// of picks, in a peer's result, the result a table is about.
	of := func(pick func(r *result) *result, f func(r *result) float64) func(r *result) float64 {
		return func(r *result) float64 { return f(pick(r)) }
	}
	drainTable := func(pick func(r *result) *result) {
		header()
		row("ready after process start (its readiness probe or log line)", "%.2f", " s", of(pick, func(r *result) float64 { return sec(r.ready) }))
		row("whole backlog in Kafka, after process start", "%.2f", " s", of(pick, func(r *result) float64 { return sec(r.inKafka) }))
		row("drain rate from process start", "%.0f", " events/s", of(pick, func(r *result) float64 { return float64(r.events) / sec(r.inKafka) }))
		row("drain rate from ready", "%.0f", " events/s", of(pick, func(r *result) float64 { return float64(r.events) / sec(r.inKafka-r.ready) }))
		ratioRow("drain time / Ferry's, from start (how many times faster Ferry drains)", of(pick, func(r *result) float64 { return sec(r.inKafka) }))
		ratioRow("drain time / Ferry's, from ready", of(pick, func(r *result) float64 { return sec(r.inKafka - r.ready) }))
		row("whole backlog confirmed (slot's confirmed_flush_lsn / offsets row), after start", "%.2f", " s", of(pick, func(r *result) float64 { return sec(r.confirmed) }))
		row("CPU seconds of the process, start to confirmed", "%.1f", " s", of(pick, func(r *result) float64 { return r.drainCPU }))
		row("CPU per event", "%.1f", " µs", of(pick, func(r *result) float64 { return r.drainCPU / float64(r.events) * 1e6 }))
		ratioRow("CPU per event / Ferry's", of(pick, func(r *result) float64 { return r.drainCPU / float64(r.events) }))
		row("peak RSS (VmHWM)", "%.0f", " MiB", of(pick, func(r *result) float64 { return r.drainRSS }))
		row("confirmed position advanced, times during the drain", "%.0f", "", of(pick, func(r *result) float64 { return float64(r.drainMarks) }))
	}
	w("\n### Backlog drain: %d events written before the process starts, in one transaction\n\n", o.events)
	drainTable(func(r *result) *result { return r })

	for k, rate := range o.rates {
		pick := func(r *result) *result { return r.rates[k] }
		w("\n### Latency at %d events/s for %s: commit returned to a consumer's fetch\n\n", rate, o.latencyFor)
		w("%d writers, one event per transaction; a franz-go consumer at the topic's end matches each record by its id header.\n"+
			"Measured on the same process, after its drain%s.\n\n", writersFor(rate), map[bool]string{true: " and the lower rates'"}[k > 0])
		header()
		row("offered", "%.0f", "", of(pick, func(r *result) float64 { return float64(r.offered) }))
		row("achieved rate", "%.0f", "/s", of(pick, func(r *result) float64 { return r.achieved }))
		row("fetched and matched", "%.0f", "", of(pick, func(r *result) float64 { return float64(r.matched) }))
		row("p50", "%.1f", " ms", of(pick, func(r *result) float64 { return msec(r.p50) }))
		row("p95", "%.1f", " ms", of(pick, func(r *result) float64 { return msec(r.p95) }))
		row("**p99**", "%.1f", " ms", of(pick, func(r *result) float64 { return msec(r.p99) }))
		row("max", "%.1f", " ms", of(pick, func(r *result) float64 { return msec(r.max) }))
		row("**CPU of the process (cores busy)**", "%.3f", "", of(pick, func(r *result) float64 { return r.rateCPU }))
		ratioRow("CPU / Ferry's", of(pick, func(r *result) float64 { return r.rateCPU }))
		row("CPU per event", "%.0f", " µs", of(pick, func(r *result) float64 { return r.rateCPU / r.achieved * 1e6 }))
		row("the Kafka broker's CPU meanwhile (cores busy: what the peer's producer costs it, plus the consumer's fetches)", "%.3f", "", of(pick, func(r *result) float64 { return r.brokerCPU }))
		ratioRow("broker CPU / with Ferry's", of(pick, func(r *result) float64 { return r.brokerCPU }))
		row("peak RSS (VmRSS sampled every 50 ms)", "%.0f", " MiB", of(pick, func(r *result) float64 { return r.rateRSS }))
		row("confirmed position advanced (times)", "%.0f", "", of(pick, func(r *result) float64 { return float64(r.rateMarks) }))
		row("median gap between advances (sampled every 50 ms: about 50 ms means at every sample)", "%.1f", " ms", of(pick, func(r *result) float64 { return msec(r.markInterval) }))
		row("longest gap between advances", "%.1f", " ms", of(pick, func(r *result) float64 { return msec(r.markIntervalHi) }))
	}

	if o.onePerTx > 0 {
		w("\n### Backlog drain: %d events written one per transaction, before a new start of the process\n\n", o.onePerTx)
		w("After the latency phases each process is stopped, the backlog written (%d transactions, committed without waiting for each flush) and the process started again on the same slot, offsets and topic.\n\n", o.onePerTx)
		drainTable(func(r *result) *result { return r.onePerTx })
	}

	w("\n### How each records its progress, and its settings\n\n")
	for _, r := range rs {
		w("- **%s** marks progress by %s.\n", r.peer.Name(), r.peer.Marks())
	}
	for _, r := range rs {
		w("\n%s:\n\n```\n%s```\n", r.peer.Name(), r.peer.Settings())
	}
	return b.String()
}

// splice puts section between the markers of file, appending the markers
// at the end when the file has none, and leaves the rest of it untouched.
func splice(file, section string) error {
	return spliceBetween(file, beginMarker, endMarker, section)
}

// spliceBetween is splice with the markers given.
func spliceBetween(file, beginMarker, endMarker, section string) error {
	old, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(old)
	block := beginMarker + "\n" + section + endMarker
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + block + s[j+len(endMarker):]
	case i >= 0 || j >= 0:
		return fmt.Errorf("%s has one of %q and %q without the other, or in the wrong order: fix it by hand", file, beginMarker, endMarker)
	default:
		if s != "" && !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		if s != "" {
			s += "\n"
		}
		s += block + "\n"
	}
	return os.WriteFile(file, []byte(s), 0o644)
}
