package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/otlprecv"
	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/internal/stats"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

type relayOpts struct {
	events, runs, rate, payload int
	latencyFor                  time.Duration
}

type env struct {
	admin   string
	brokers []string
	dir     string   // scratch directory with the relay binary
	environ []string // more of the relay process's environment
	noKafka bool     // the relay publishes to RabbitMQ: no FERRY_KAFKA_BROKERS
}

func stackEnv() (*env, error) {
	admin, brokers := os.Getenv(ferrytest.EnvDatabaseURL), os.Getenv(ferrytest.EnvKafkaBrokers)
	if admin == "" || brokers == "" {
		return nil, errors.New("FERRY_TEST_DATABASE_URL and FERRY_TEST_KAFKA_BROKERS are not set: eval \"$(scripts/stack up)\" first")
	}
	dir, err := os.MkdirTemp("", "ferrybench")
	if err != nil {
		return nil, err
	}
	return &env{admin: admin, brokers: strings.Split(brokers, ","), dir: dir}, nil
}

func (e *env) build(pkg, name string) (string, error) {
	bin := filepath.Join(e.dir, name)
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

func log(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ferrybench: "+format+"\n", args...)
}

// relayResult holds the relay's figures and their ceilings, relayOpts.runs
// samples of each, taken in rounds: walsender ceiling, relay drain, peek,
// produce.
type relayResult struct {
	o           relayOpts
	walsender   samples    // the walsender streaming the backlog to a client that discards it, events/s
	wsBusy      samples    // its walsender's share of one core
	recv        samples    // the walsender streaming the backlog to pg_recvlogical writing /dev/null, events/s
	recvBusy    samples    // its walsender's share of one core
	recvBox     samples    // the machine's share busy meanwhile, all cores
	recvTime    [3]samples // its walsender's time while streaming: on a core, waiting for one, neither
	drainBox    samples    // the machine's share busy during the relay's drain
	drainAll    samples    // the machine's CPU microseconds per event during the drain, every process
	drainKafka  samples    // the Kafka broker's CPU microseconds per event during the drain
	traced      samples    // the relay with --trace-events, exporting its spans, events/s
	former      samples    // the relay with its defaults before 2026-12-04 (formerDefaults), events/s
	formerCost  samples    // its CPU microseconds per event
	tracedCost  samples    // its CPU microseconds per event
	tracedSpans samples    // spans its exporter delivered
	drain       samples    // the relay, backlog to confirmed, events/s
	drainBusy   samples    // its walsender's share of one core
	drainTime   [3]samples // its walsender's time while streaming: on a core, waiting for one, neither
	relayBusy   samples    // the relay process's share of one core
	relayCost   samples    // its CPU microseconds per event
	wsStart     samples    // ms from connecting until the ceiling's walsender streams
	relayStart  samples    // ms from the relay's process start until its walsender streams
	relayHeld   samples    // share of the drain with the relay's unconfirmed window at its limit
	relayPeak   samples    // the largest window seen
	decode      samples    // server-side pgoutput decode (peek), events/s
	produce     samples    // raw franz-go produce of the same records, events/s
	drainRSS    samples    // peak RSS while draining, MB
	lat         latency
}

func benchRelay(ctx context.Context, o relayOpts, out io.Writer) error {
	e, err := stackEnv()
	if err != nil {
		return err
	}
	defer os.RemoveAll(e.dir)
	r, err := runRelay(ctx, e, o)
	if err != nil {
		return err
	}
	_, err = io.WriteString(out, r.markdown())
	return err
}

func runRelay(ctx context.Context, e *env, o relayOpts) (*relayResult, error) {
	relayBin, err := e.build("github.com/ferryhq/ferry/cmd/relay", "relay")
	if err != nil {
		return nil, err
	}
	recvBin, err := pgRecvlogical()
	if err != nil {
		return nil, fmt.Errorf("pg_recvlogical, the walsender ceiling's client: %w", err)
	}
	ds, err := newDrainSetup(ctx, e, "bench_relay")
	if err != nil {
		return nil, err
	}
	defer ds.close()
	url, pool := ds.url, ds.pool

	suffix := ferrytest.Suffix()
	slot := func(i int) string { return fmt.Sprintf("bench_%s_%d", suffix, i) }
	wsSlot := func(i int) string { return fmt.Sprintf("bench_%s_ws_%d", suffix, i) }
	recvSlot := func(i int) string { return fmt.Sprintf("bench_%s_recv_%d", suffix, i) }
	traceSlot := func(i int) string { return fmt.Sprintf("bench_%s_trace_%d", suffix, i) }
	traceTopic := func(i int) string { return fmt.Sprintf("bench.%s.%d.traced", suffix, i) }
	onePSlot := func(i int) string { return fmt.Sprintf("bench_%s_onep_%d", suffix, i) }
	onePTopic := func(i int) string { return fmt.Sprintf("bench.%s.%d.onep", suffix, i) }
	peekSlot := "bench_" + suffix + "_peek"
	topic := func(i int) string { return fmt.Sprintf("bench.%s.%d.load", suffix, i) }
	produceTopic := func(i int) string { return fmt.Sprintf("bench.%s.%d.produce", suffix, i) }
	// Every slot exists before the backlog is written, so each sees all of
	// it: the relay's and the walsender ceiling's (one per run each:
	// streaming consumes a slot) and peek's (which does not). They are
	// copies of the first, so all start at the same LSN.
	slots := []string{slot(0), peekSlot}
	for i := range o.runs {
		if i > 0 {
			slots = append(slots, slot(i))
		}
		slots = append(slots, wsSlot(i), recvSlot(i), traceSlot(i), onePSlot(i))
		if err := ds.topics(ctx, topic(i), produceTopic(i), traceTopic(i), onePTopic(i)); err != nil {
			return nil, err
		}
	}
	if err := ds.slots(ctx, slots...); err != nil {
		return nil, err
	}

	log("writing a backlog of %d events", o.events)
	start := time.Now()
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT gen_random_uuid(), 'load', 'agg-' || (i % 1000), 'Changed', convert_to(repeat('x', $2), 'UTF8'), '{"k":"v"}'
		FROM generate_series(1, $1) i`, o.events, o.payload); err != nil {
		return nil, err
	}
	log("backlog written in %s", time.Since(start).Round(time.Millisecond))
	var target string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		return nil, err
	}

	// Rounds of: (a) the walsender ceiling, the walsender streaming the
	// backlog with the relay's options to a client that discards it, (b)
	// the relay draining it into Kafka as a real process, next to it so
	// both see the same machine; then the second-line ceilings, (c)
	// PostgreSQL decoding the same rows server-side (peek, not the path the
	// relay reads) and (d) franz-go producing the same records with the
	// relay's producer settings and no database upstream.
	res := &relayResult{o: o}
	for i := range o.runs {
		ws, err := walsenderOnce(ctx, url, pool, wsSlot(i), target)
		if err != nil {
			return nil, err
		}
		rate := float64(o.events) / ws.elapsed.Seconds()
		res.walsender, res.wsBusy = append(res.walsender, rate), append(res.wsBusy, ws.walsenderBusy())
		res.wsStart = append(res.wsStart, float64(ws.attached.Milliseconds()))
		log("round %d: ceiling: walsender to a discarding client %.0f events/s (walsender %.0f%% of a core, streaming after %s)",
			i+1, rate, ws.walsenderBusy()*100, ws.attached.Round(time.Millisecond))

		m := markCPU()
		rl, err := recvlogicalOnce(ctx, recvBin, url, pool, recvSlot(i), target)
		if err != nil {
			return nil, err
		}
		box, _ := m.since()
		rate = float64(o.events) / rl.elapsed.Seconds()
		res.recv, res.recvBusy, res.recvBox = append(res.recv, rate), append(res.recvBusy, rl.walsenderBusy()), append(res.recvBox, box)
		on, off, blocked := rl.walsenderTime()
		res.recvTime = [3]samples{append(res.recvTime[0], on), append(res.recvTime[1], off), append(res.recvTime[2], blocked)}
		log("round %d: ceiling: walsender to pg_recvlogical %.0f events/s (walsender %.0f%% of a core; while streaming on a core %.0f%%, waiting for one %.0f%%, neither %.0f%%)",
			i+1, rate, rl.walsenderBusy()*100, on*100, off*100, blocked*100)

		m = markCPU()
		d, w, err := drainOnce(ctx, e, relayBin, url, pool, slot(i), topic(i), target)
		if err != nil {
			return nil, err
		}
		box, kafka := m.since()
		res.drainBox = append(res.drainBox, box)
		res.drainAll = append(res.drainAll, box*float64(runtime.NumCPU())*d.elapsed.Seconds()/float64(o.events)*1e6)
		res.drainKafka = append(res.drainKafka, kafka/float64(o.events)*1e6)
		rate = float64(o.events) / d.elapsed.Seconds()
		res.drain, res.drainRSS = append(res.drain, rate), append(res.drainRSS, w.peakRSS)
		res.drainBusy, res.relayBusy = append(res.drainBusy, d.walsenderBusy()), append(res.relayBusy, w.busy)
		on, off, blocked = d.walsenderTime()
		res.drainTime = [3]samples{append(res.drainTime[0], on), append(res.drainTime[1], off), append(res.drainTime[2], blocked)}
		log("round %d: relay drain: its walsender while streaming on a core %.0f%%, waiting for one %.0f%%, neither %.0f%%", i+1, on*100, off*100, blocked*100)
		res.relayStart, res.relayHeld = append(res.relayStart, float64(d.attached.Milliseconds())), append(res.relayHeld, w.held())
		res.relayPeak = append(res.relayPeak, w.windowPeak)
		res.relayCost = append(res.relayCost, w.busy*d.elapsed.Seconds()/float64(o.events)*1e6)
		log("round %d: relay drain %.0f events/s (walsender %.0f%% of a core, relay %.0f%%, streaming after %s, held by back-pressure %.0f%% of the time, peak window %.0f), peak RSS %.1f MB",
			i+1, rate, d.walsenderBusy()*100, w.busy*100, d.attached.Round(time.Millisecond), w.held()*100, w.windowPeak, w.peakRSS)

		// The same drain with the relay's former defaults: its Go runtime
		// on one P per core, no read window, a 1 ms linger.
		oe := *e
		oe.environ = append(slices.Clone(e.environ), formerEnv...)
		d1, w1, err := drainOnce(ctx, &oe, relayBin, url, pool, onePSlot(i), onePTopic(i), target, formerArgs...)
		if err != nil {
			return nil, err
		}
		rate = float64(o.events) / d1.elapsed.Seconds()
		res.former, res.formerCost = append(res.former, rate), append(res.formerCost, w1.busy*d1.elapsed.Seconds()/float64(o.events)*1e6)
		log("round %d: relay drain with the former defaults %.0f events/s (walsender %.0f%% of a core, relay %.0f%%)", i+1, rate, d1.walsenderBusy()*100, w1.busy*100)

		traced, err := tracedDrain(ctx, e, relayBin, url, pool, traceSlot(i), traceTopic(i), target)
		if err != nil {
			return nil, err
		}
		rate = float64(o.events) / traced.d.elapsed.Seconds()
		res.traced, res.tracedCost = append(res.traced, rate), append(res.tracedCost, traced.w.busy*traced.d.elapsed.Seconds()/float64(o.events)*1e6)
		res.tracedSpans = append(res.tracedSpans, float64(traced.spans))
		log("round %d: relay drain with --trace-events %.0f events/s (relay %.0f%% of a core), %d spans exported", i+1, rate, traced.w.busy*100, traced.spans)

		start := time.Now()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
			'proto_version', '1', 'publication_names', 'ferry', 'binary', 'true')`, peekSlot).Scan(&n); err != nil {
			return nil, err
		}
		res.decode = append(res.decode, float64(o.events)/time.Since(start).Seconds())
		log("round %d: ceiling: server-side decode (peek) %.0f events/s", i+1, res.decode[i])

		rate, err = produceOnce(ctx, e, produceTopic(i), o.events, o.payload)
		if err != nil {
			return nil, err
		}
		res.produce = append(res.produce, rate)
		log("round %d: ceiling: franz-go produce %.0f events/s", i+1, rate)
	}

	// (e) Commit-to-ack latency at a steady offered rate, (f) RSS meanwhile.
	res.lat, err = latencyPhase(ctx, e, relayBin, url, pool, slot(0), topic(0), o)
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (r *relayResult) markdown() string {
	var b strings.Builder
	o, lat := r.o, r.lat
	drain := r.drain.Median()
	fmt.Fprintf(&b, "| relay figure (%d-event backlog, %d-byte payloads; median (min–max) of %d rounds: two walsender ceilings, relay, peek, produce) | value | target |\n|---|---|---|\n",
		o.events, o.payload, o.runs)
	fmt.Fprintf(&b, "| **ceiling: the walsender streaming the backlog to PostgreSQL's own client, `pg_recvlogical -f /dev/null`** | %s events/s, walsender at %s%% of a core (%s µs per event) | |\n",
		r.recv.Format("%.0f"), scale(r.recvBusy, 100).Format("%.0f"), perEvent(r.recvBusy, r.recv).Format("%.1f"))
	fmt.Fprintf(&b, "| relay drain rate, backlog to Kafka acks, confirmed in the slot | %s events/s, walsender at %s%% of a core (%s µs per event), relay at %s%% (%s µs CPU per event) | |\n",
		r.drain.Format("%.0f"), scale(r.drainBusy, 100).Format("%.0f"), perEvent(r.drainBusy, r.drain).Format("%.1f"), scale(r.relayBusy, 100).Format("%.0f"), r.relayCost.Format("%.1f"))
	fmt.Fprintf(&b, "| **drain / walsender ceiling** (ratio of medians; range of the rounds' ratios) | **%.2f** (%s) | >= 0.90 |\n",
		drain/r.recv.Median(), stats.Ratios(r.drain, r.recv).Range("%.2f"))
	fmt.Fprintf(&b, "| drain / the walsender's own bound during the drain: its rate had it been on a core all the time it streamed, at the CPU per event it spent (no client of it passes this) | **%.2f** (%s) | |\n",
		r.drainTime[0].Median(), r.drainTime[0].Range("%.2f"))
	fmt.Fprintf(&b, "| the walsender's time while it streamed: on a core / runnable, waiting for a core (`/proc/PID/schedstat`) / neither (waiting on its client's socket, for WAL or for I/O): to `pg_recvlogical`; to the relay | %s / %s / %s%%; %s / %s / %s%% | |\n",
		scale(r.recvTime[0], 100).Format("%.0f"), scale(r.recvTime[1], 100).Format("%.0f"), scale(r.recvTime[2], 100).Format("%.0f"),
		scale(r.drainTime[0], 100).Format("%.0f"), scale(r.drainTime[1], 100).Format("%.0f"), scale(r.drainTime[2], 100).Format("%.0f"))
	fmt.Fprintf(&b, "| the machine (%d cores) busy during the ceiling / during the relay's drain | %s%% / %s%% | |\n",
		runtime.NumCPU(), scale(r.recvBox, 100).Format("%.0f"), scale(r.drainBox, 100).Format("%.0f"))
	fmt.Fprintf(&b, "| CPU per event during the relay's drain, every process on the machine (walsender, relay, Kafka broker, ...); of which the broker | %s µs; broker %s µs (%d cores at 100%% drain at most %.0f events/s at this cost) | |\n",
		r.drainAll.Format("%.1f"), r.drainKafka.Format("%.1f"), runtime.NumCPU(), float64(runtime.NumCPU())*1e6/r.drainAll.Median())
	fmt.Fprintf(&b, "| second line: the walsender streaming to a minimal Go client (pglogrepl) that discards every change and confirms as the relay does | %s events/s, walsender at %s%% of a core (%s µs per event); drain / this %.2f (%s) | |\n",
		r.walsender.Format("%.0f"), scale(r.wsBusy, 100).Format("%.0f"), perEvent(r.wsBusy, r.walsender).Format("%.1f"), drain/r.walsender.Median(), stats.Ratios(r.drain, r.walsender).Range("%.2f"))
	fmt.Fprintf(&b, "| relay drain with its defaults before 2026-12-04 (`GOMAXPROCS=%d`, one P per core, `relay run %s`; today's run on one P, with a 5 ms read window and no linger: [relay.md](relay.md#cpu)) | %s events/s, relay %s µs CPU per event; today's drain / this: %.2f (%s) | |\n",
		runtime.NumCPU(), strings.Join(formerArgs, " "), r.former.Format("%.0f"), r.formerCost.Format("%.1f"), drain/r.former.Median(), stats.Ratios(r.drain, r.former).Range("%.2f"))
	fmt.Fprintf(&b, "| relay drain with `--trace-events`: a producer span per event, exported with OTLP over HTTP to a receiver on this machine (batches of %d, queue %d) | %s events/s, relay %s µs CPU per event, %s spans exported; / the drain without: %.2f (%s) | |\n",
		tracedBatch, tracedQueue, r.traced.Format("%.0f"), r.tracedCost.Format("%.1f"), r.tracedSpans.Format("%.0f"), r.traced.Median()/drain, stats.Ratios(r.traced, r.drain).Range("%.2f"))
	fmt.Fprintf(&b, "| start to streaming (until the slot's walsender is active, polled every 20 ms, inside the times above): ceiling / relay (process start) | %s / %s ms | |\n",
		r.wsStart.Format("%.0f"), r.relayStart.Format("%.0f"))
	fmt.Fprintf(&b, "| relay held by its back-pressure: share of 100 ms samples of its gauge `ferry_relay_unconfirmed_records` (set at each status update) at its limit, %d (waiting on Kafka's acks, not reading) | %s%%, largest window %s | |\n",
		relay.MaxInFlightRecordsDefault, scale(r.relayHeld, 100).Format("%.0f"), r.relayPeak.Format("%.0f"))
	fmt.Fprintf(&b, "| second line: server-side pgoutput decode (`pg_logical_slot_peek_binary_changes`, same options), not the path the relay reads | %s events/s | |\n",
		r.decode.Format("%.0f"))
	fmt.Fprintf(&b, "| drain / peek | %.2f (%s) | |\n", drain/r.decode.Median(), stats.Ratios(r.drain, r.decode).Range("%.2f"))
	fmt.Fprintf(&b, "| ceiling: raw franz-go produce of the same records (relay's producer settings) | %s events/s | |\n", r.produce.Format("%.0f"))
	fmt.Fprintf(&b, "| drain / produce ceiling | %.2f (%s) | |\n", drain/r.produce.Median(), stats.Ratios(r.drain, r.produce).Range("%.2f"))
	fmt.Fprintf(&b, "| commit-to-ack p50 at %d events/s (relay histogram) | %.1f ms | |\n", o.rate, lat.histP50*1000)
	fmt.Fprintf(&b, "| commit-to-ack p99 at %d events/s (relay histogram) | **%.1f ms** | <= 20 ms |\n", o.rate, lat.histP99*1000)
	fmt.Fprintf(&b, "| commit-to-consumer p50 / p99 (writer's commit returned to a consumer's fetch) | %.1f / %.1f ms | |\n", lat.e2eP50*1000, lat.e2eP99*1000)
	fmt.Fprintf(&b, "| achieved offered rate | %.0f events/s | |\n", lat.achieved)
	fmt.Fprintf(&b, "| relay peak RSS while draining | **%s MB** | <= 150 MB |\n", r.drainRSS.Format("%.1f"))
	fmt.Fprintf(&b, "| relay peak RSS at %d events/s | %.1f MB | |\n", o.rate, lat.rss)
	fmt.Fprintf(&b, "\nThe walsender ceiling: `pg_recvlogical` streams a slot of its own, created at the relay's LSN, with the relay's pgoutput options "+
		"(`%s`) into `/dev/null`, timed from its start until it exits at the backlog's end (`--endpos`); the relay is timed from its process start until the slot's `confirmed_flush_lsn` reaches the same position. "+
		"The Go client of the second line is slower than PostgreSQL's own: it reads one message at a time, and the walsender spends more per event when its client keeps it waiting. "+
		"Either client can come out below the relay: a client that takes each message as soon as it is sent makes the walsender send (and wake it) once per message, "+
		"while a busier one lets the messages gather in the walsender's sends. The walsender's own bound does not depend on the client: "+
		"one process decoding on one core cannot stream faster than a core divided by what it spends per event, and the split of its time says what kept it below that: "+
		"the relay (time on neither, its socket full) or the other processes on the machine (runnable, waiting for a core).\n",
		strings.Join(relayPluginArgs, ", "))
	return b.String()
}

// scale multiplies every sample by k.
// formerEnv and formerArgs give `relay run` its defaults before
// 2026-12-04: one P per core, reads as soon as data arrives, a 1 ms linger.
var (
	formerEnv  = []string{"GOMAXPROCS=" + strconv.Itoa(runtime.NumCPU())}
	formerArgs = []string{"--read-window", "0", "--kafka-linger", "1ms"}
)

func scale(s samples, k float64) samples {
	out := make(samples, len(s))
	for i, x := range s {
		out[i] = x * k
	}
	return out
}

// produceOnce produces events records shaped like the relay's (key,
// payload, the four Ferry headers and the row's own) to topic with the
// relay's producer settings, and returns events/s until the last ack.
func produceOnce(ctx context.Context, e *env, topic string, events, payload int) (float64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.MaxBufferedRecords(relay.MaxInFlightRecordsDefault+1), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	value := []byte(strings.Repeat("x", payload))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	for i := range events {
		agg := []byte("agg-" + strconv.Itoa(i%1000))
		id, _ := uuid.New().MarshalText()
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Key: agg, Value: value, Timestamp: time.Now(), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: id}, {Key: outbox.HeaderEventType, Value: []byte("Changed")}, {Key: outbox.HeaderAggregateType, Value: []byte("load")},
			{Key: outbox.HeaderAggregateID, Value: agg}, {Key: "k", Value: []byte("v")},
		}}, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				firstErr = cmp.Or(firstErr, err)
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("produce to %s: %w", topic, firstErr)
	}
	return float64(events) / time.Since(start).Seconds(), nil
}

type relayProc struct {
	cmd     *exec.Cmd
	metrics string
	done    chan error
	logFile string
}

func startRelay(e *env, bin, url, slot, topicTemplate string, extra ...string) (*relayProc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	logFile := filepath.Join(e.dir, slot+".log")
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	args := append([]string{"run", "--slot", slot, "--topic-template", topicTemplate, "--http-addr", addr, "--log-format", "json"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), e.environ...), "FERRY_DATABASE_URL="+url)
	if !e.noKafka {
		cmd.Env = append(cmd.Env, "FERRY_KAFKA_BROKERS="+strings.Join(e.brokers, ","))
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &relayProc{cmd: cmd, metrics: "http://" + addr + "/metrics", done: make(chan error, 1), logFile: logFile}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	return p, nil
}

func (p *relayProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		return errors.New("relay did not stop within 60s of SIGTERM")
	}
}

// drainOnce starts a relay on slot and times it from process start until
// the slot's confirmed_flush_lsn reaches target. It also watches the
// process: its peak RSS, its share of one core, and how often its
// back-pressure held it (the window of unconfirmed records at
// relay.MaxInFlightRecordsDefault, so it read no further). extra are more
// `relay run` flags.
func drainOnce(ctx context.Context, e *env, bin, url string, pool *pgxpool.Pool, slot, topic, target string, extra ...string) (d drained, w watched, err error) {
	start := time.Now()
	profile := os.Getenv("FERRYBENCH_PROFILE_DIR")
	if profile != "" {
		extra = append(extra, "--http-pprof")
	}
	p, err := startRelay(e, bin, url, slot, topic, extra...)
	if err != nil {
		return d, w, err
	}
	defer func() {
		if serr := p.stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	if profile != "" {
		go profileRelay(p, filepath.Join(profile, slot+".pprof"))
	}
	exited := make(chan error, 1)
	stopWatch := make(chan struct{})
	watchedc := make(chan watched, 1)
	go func() {
		var w watched
		for i := 0; ; i++ {
			w.peakRSS = max(w.peakRSS, procs.MemMB(p.cmd.Process.Pid, "VmHWM"))
			if i%5 == 0 { // every 100 ms: the scrape costs the relay a little
				if n, err := scrapeGauge(p.metrics, "ferry_relay_unconfirmed_records"); err == nil {
					w.windowSamples++
					w.windowPeak = max(w.windowPeak, n)
					if n >= relay.MaxInFlightRecordsDefault {
						w.windowFull++
					}
				}
			}
			select {
			case err := <-p.done:
				exited <- fmt.Errorf("relay exited during the drain: %v; its log ends:\n%s", err, logTail(p.logFile, 3))
				p.done <- err // for stop
				watchedc <- w
				return
			case <-stopWatch:
				w.peakRSS = max(w.peakRSS, procs.MemMB(p.cmd.Process.Pid, "VmHWM"))
				watchedc <- w
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	d, err = waitConfirmed(ctx, pool, slot, target, start, exited)
	relayCPU, relayWait := cpuSeconds(p.cmd.Process.Pid), runQueueWait(p.cmd.Process.Pid)
	if err == nil {
		w.counts = scrapeCounts(p.metrics)
	}
	close(stopWatch)
	counts := w.counts
	w = <-watchedc
	w.counts = counts
	if err != nil {
		return d, w, err
	}
	w.busy, w.noCore = relayCPU/d.elapsed.Seconds(), relayWait/d.elapsed.Seconds()
	return d, w, nil
}

// profileRelay writes a CPU profile of the relay's first 2 seconds of
// drain (FERRYBENCH_PROFILE_DIR: where a drain's time goes).
func profileRelay(p *relayProc, path string) {
	u := strings.TrimSuffix(p.metrics, "/metrics") + "/debug/pprof/profile?seconds=2"
	var resp *http.Response
	var err error
	for range 100 {
		if resp, err = http.Get(u); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		log("profile: %v", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		log("profile: %v", err)
	}
}

// logTail is the last n lines of a log file (the scratch directory that
// holds it goes when ferrybench ends).
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// wakeCounts are a relay's counters of its wake-ups: replication socket
// reads, WAL messages received, Kafka produce requests (0 when not read).
type wakeCounts struct{ reads, wal, produces float64 }

// scrapeCounts reads a relay's wakeCounts from its metrics.
func scrapeCounts(metrics string) wakeCounts {
	var c wakeCounts
	c.reads, _ = scrapeGauge(metrics, "ferry_relay_replication_reads_total")
	c.wal, _ = scrapeGauge(metrics, `ferry_relay_replication_messages_total{kind="wal"}`)
	c.produces, _ = scrapeGauge(metrics, "ferry_relay_kafka_produce_requests_total")
	return c
}

// watched is what drainOnce saw of the relay process.
type watched struct {
	counts                    wakeCounts // at the end of the drain
	peakRSS                   float64    // MB
	busy                      float64    // share of one core
	noCore                    float64    // its threads' time runnable without a core, s per s
	windowSamples, windowFull int        // metrics scrapes, and those with the window at its limit
	windowPeak                float64    // the largest window seen
}

// held is the share of the drain the relay's back-pressure held it.
func (w watched) held() float64 {
	if w.windowSamples == 0 {
		return 0
	}
	return float64(w.windowFull) / float64(w.windowSamples)
}

// scrapeGauge reads one unlabelled gauge from a Prometheus text page.
func scrapeGauge(url, name string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in %s", name, url)
}

type latency struct {
	histP50, histP99, e2eP50, e2eP99, achieved, rss float64
}

func latencyPhase(ctx context.Context, e *env, bin, url string, pool *pgxpool.Pool, slot, topic string, o relayOpts) (latency, error) {
	var res latency
	p, err := startRelay(e, bin, url, slot, topic)
	if err != nil {
		return res, err
	}
	defer func() { _ = p.stop() }()
	for {
		var active bool
		if err := pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active); err != nil {
			return res, err
		}
		if active {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	before, err := scrapeHistogram(p.metrics)
	if err != nil {
		return res, err
	}

	cons, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return res, err
	}
	defer cons.Close()
	var committed sync.Map // id -> time the commit returned
	var mu sync.Mutex
	var e2e []float64
	cctx, ccancel := context.WithCancel(ctx)
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		for cctx.Err() == nil {
			fs := cons.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == outbox.HeaderID {
						if t, ok := committed.Load(string(h.Value)); ok {
							mu.Lock()
							e2e = append(e2e, now.Sub(t.(time.Time)).Seconds())
							mu.Unlock()
						}
					}
				}
			})
		}
	}()
	time.Sleep(time.Second) // let the consumer join its partitions

	const writers = 4
	interval := time.Duration(float64(time.Second) * writers / float64(o.rate))
	var wg sync.WaitGroup
	var count int64
	var countMu sync.Mutex
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; time.Since(start) < o.latencyFor; i++ {
				<-tick.C
				ids, err := outbox.Write(ctx, pool, outbox.Event{
					AggregateType: "load", AggregateID: fmt.Sprintf("w%d-%d", w, i%100), EventType: "Changed",
					Payload: make([]byte, o.payload),
				})
				if err != nil {
					log("latency writer: %v", err)
					return
				}
				committed.Store(ids[0].String(), time.Now())
				countMu.Lock()
				count++
				countMu.Unlock()
			}
		}()
	}
	var peak float64
	go func() {
		for time.Since(start) < o.latencyFor {
			peak = max(peak, procs.MemMB(p.cmd.Process.Pid, "VmRSS"))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	wg.Wait()
	res.achieved = float64(count) / time.Since(start).Seconds()
	time.Sleep(2 * time.Second)
	ccancel()
	<-consDone

	after, err := scrapeHistogram(p.metrics)
	if err != nil {
		return res, err
	}
	res.histP50 = after.minus(before).quantile(0.50)
	res.histP99 = after.minus(before).quantile(0.99)
	mu.Lock()
	slices.Sort(e2e)
	if len(e2e) > 0 {
		res.e2eP50 = e2e[len(e2e)/2]
		res.e2eP99 = e2e[len(e2e)*99/100]
	}
	mu.Unlock()
	res.rss = peak
	return res, nil
}

// histogram is a Prometheus histogram's cumulative buckets.
type histogram struct {
	bounds []float64
	counts []float64
}

func scrapeHistogram(url string) (histogram, error) {
	var h histogram
	resp, err := http.Get(url)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `ferry_relay_commit_to_ack_seconds_bucket{le="`)
		if !ok {
			continue
		}
		le, count, _ := strings.Cut(rest, `"} `)
		b, err := strconv.ParseFloat(le, 64)
		if le == "+Inf" {
			b, err = 1e9, nil
		}
		c, err2 := strconv.ParseFloat(count, 64)
		if err != nil || err2 != nil {
			return h, fmt.Errorf("parse bucket %q", line)
		}
		h.bounds = append(h.bounds, b)
		h.counts = append(h.counts, c)
	}
	return h, sc.Err()
}

func (h histogram) minus(o histogram) histogram {
	out := histogram{bounds: h.bounds, counts: slices.Clone(h.counts)}
	for i := range out.counts {
		if i < len(o.counts) {
			out.counts[i] -= o.counts[i]
		}
	}
	return out
}

// quantile interpolates linearly inside the bucket holding q.
func (h histogram) quantile(q float64) float64 {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return 0
	}
	rank := q * h.counts[len(h.counts)-1]
	lower, below := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank {
			if c == below {
				return h.bounds[i]
			}
			return lower + (h.bounds[i]-lower)*(rank-below)/(c-below)
		}
		lower, below = h.bounds[i], c
	}
	return h.bounds[len(h.bounds)-1]
}

// cpuMark is a reading of the machine's CPU time, the Kafka broker's and
// the RabbitMQ node's.
type cpuMark struct{ busy, all, broker, rabbit float64 }

func markCPU() cpuMark {
	busy, all, _ := procs.MachineCPU()
	return cpuMark{busy: busy, all: all, broker: cpuSeconds(ferrytest.KafkaBrokerPID()), rabbit: cpuSeconds(ferrytest.RabbitMQPID())}
}

// since is the machine's share busy since m (over all cores) and the
// broker's CPU seconds since m.
func (m cpuMark) since() (box, broker float64) {
	box, broker, _ = m.sinceAll()
	return box, broker
}

// sinceAll is since with the RabbitMQ node's CPU seconds since m.
func (m cpuMark) sinceAll() (box, kafka, rabbit float64) {
	n := markCPU()
	if n.all > m.all {
		box = (n.busy - m.busy) / (n.all - m.all)
	}
	return box, n.broker - m.broker, n.rabbit - m.rabbit
}

// perEvent turns shares of a core into CPU microseconds per event at the
// paired rates.
func perEvent(busy, rate samples) samples {
	out := make(samples, 0, min(len(busy), len(rate)))
	for i := range min(len(busy), len(rate)) {
		if rate[i] > 0 {
			out = append(out, busy[i]/rate[i]*1e6)
		}
	}
	return out
}

// The span exporter's settings in tracedDrain: large enough batches and
// queue that every span of the backlog is exported, none dropped.
const (
	tracedBatch = 4096
	tracedQueue = 65536
)

// traced is how the relay drained with --trace-events.
type traced struct {
	d     drained
	w     watched
	spans int // delivered to the receiver by the end of the drain
}

// tracedDrain is drainOnce with --trace-events, the relay exporting its
// spans over OTLP/HTTP (its OTEL_* variables) to a receiver in this
// process that counts them, as a collector on the machine would.
func tracedDrain(ctx context.Context, e *env, bin, url string, pool *pgxpool.Pool, slot, topic, target string) (traced, error) {
	recv := &otlprecv.Receiver{CountOnly: true}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	te := *e
	te.environ = append(slices.Clone(e.environ), "OTEL_EXPORTER_OTLP_ENDPOINT="+srv.URL, "OTEL_SERVICE_NAME=ferry-relay-bench",
		"OTEL_BSP_MAX_EXPORT_BATCH_SIZE="+strconv.Itoa(tracedBatch), "OTEL_BSP_MAX_QUEUE_SIZE="+strconv.Itoa(tracedQueue))
	d, w, err := drainOnce(ctx, &te, bin, url, pool, slot, topic, target, "--trace-events")
	return traced{d: d, w: w, spans: recv.Count()}, err
}
