package main

// ferrybench curves: how the relay's and the worker's costs grow with the
// shape of the work, one setting swept at a time, as tables and SVG charts
// (docs/bench/*.svg) with a sentence on where each curve bends.

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

type curveOpts struct {
	scale  float64  // multiplies every sweep's event and message counts
	charts string   // directory the SVG charts are written to; "" writes none
	link   string   // how the markdown refers to that directory
	only   []string // run only these curves (their chart names); all when empty
}

// bendTolerance is the step, as a share, below which a curve counts as
// flat: a curve bends where a step stops (or starts) moving it by more.
const bendTolerance = 0.10

// curve is one sweep: the values of the swept setting, a table row and a
// chart point for each, and sentences on where it bends and why.
type curve struct {
	name    string // file name of its chart, without .svg
	heading string
	setup   string // what held still
	columns []string
	rows    [][]string // one per point, the swept value first
	chart   chart
	bends   []string // computed from the figures
	why     string
}

func (c *curve) markdown(o curveOpts) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### %s\n\n%s\n\n", c.heading, c.setup)
	if o.charts != "" {
		fmt.Fprintf(&b, "![%s](%s/%s.svg)\n\n", c.chart.title, o.link, c.name)
	}
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(c.columns, " | "), strings.Repeat("---|", len(c.columns)))
	for _, r := range c.rows {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintf(&b, "\nWhere it bends: %s\n\nWhy: %s\n", strings.Join(c.bends, " "), c.why)
	return b.String()
}

// benchCurves runs every sweep and returns the "How cost grows" section,
// writing the charts into o.charts.
func benchCurves(ctx context.Context, e *env, o curveOpts) (string, error) {
	started := time.Now()
	var cs []*curve
	want := func(name string) bool { return len(o.only) == 0 || slices.Contains(o.only, name) }
	relaySweeps := []struct {
		name string
		run  func(context.Context, *relayCurves, float64) (*curve, error)
	}{{"relay-payload", payloadCurve}, {"relay-events-per-tx", perTxCurve}, {"relay-topics", topicsCurve}, {"relay-max-in-flight", inFlightCurve}}
	var rc *relayCurves
	defer func() {
		if rc != nil {
			rc.close()
		}
	}()
	for _, sweep := range relaySweeps {
		if !want(sweep.name) {
			continue
		}
		if rc == nil {
			var err error
			if rc, err = newRelayCurves(ctx, e); err != nil {
				return "", err
			}
		}
		c, err := sweep.run(ctx, rc, o.scale)
		if err != nil {
			return "", err
		}
		cs = append(cs, c)
	}
	workerSweeps := []struct {
		name string
		run  func(context.Context, *env, float64) (*curve, error)
	}{{"worker-partitions", partitionsCurve}, {"worker-concurrency", concurrencyCurve}, {"worker-key-concurrency", keyConcurrencyCurve}, {"worker-batch-size", batchCurve}}
	for _, sweep := range workerSweeps {
		if !want(sweep.name) {
			continue
		}
		c, err := sweep.run(ctx, e, o.scale)
		if err != nil {
			return "", err
		}
		cs = append(cs, c)
	}
	if o.charts != "" {
		if err := os.MkdirAll(o.charts, 0o755); err != nil {
			return "", err
		}
		for _, c := range cs {
			if err := os.WriteFile(filepath.Join(o.charts, c.name+".svg"), c.chart.svg(), 0o644); err != nil {
				return "", err
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## How cost grows\n\n"+
		"One setting swept at a time, everything else as in the sections above; written by `ferrybench curves` "+
		"(part of `make bench`: `-curves-scale` sizes it, `-curves=false` skips it) in %s at scale %g. "+
		"**One sample per point**: a curve's shape is the finding, a single point's figure moves with the machine's load "+
		"as the medians above do. A rising curve bends at its first point that no later point beats by more than %.0f%% (a falling one likewise); "+
		"a flat one where a step first moves it by more than that.\n",
		time.Since(started).Round(time.Second), o.scale, bendTolerance*100)
	for _, c := range cs {
		b.WriteString(c.markdown(o))
	}
	return b.String(), nil
}

// relayCurves is a database of its own with the relay built, on which the
// relay sweeps drain one backlog after another.
type relayCurves struct {
	e      *env
	bin    string
	url    string
	pool   *pgxpool.Pool
	adm    *kadm.Client
	suffix string
	n      int // backlogs drained so far
	close  func()
}

func newRelayCurves(ctx context.Context, e *env) (*relayCurves, error) {
	bin, err := e.build("github.com/ferryhq/ferry/cmd/relay", "relay")
	if err != nil {
		return nil, err
	}
	url, drop, err := ferrytest.MainDB("bench_curves")
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		drop()
		return nil, err
	}
	kcl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		pool.Close()
		drop()
		return nil, err
	}
	r := &relayCurves{e: e, bin: bin, url: url, pool: pool, adm: kadm.NewClient(kcl), suffix: ferrytest.Suffix(),
		close: func() { kcl.Close(); pool.Close(); drop() }}
	for _, q := range []string{
		`CREATE PUBLICATION ferry FOR TABLE outbox WITH (publish = 'insert')`,
		`CREATE TABLE curves_payload (p bytea NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			r.close()
			return nil, err
		}
	}
	return r, nil
}

// backlog is the shape of the events a relay point drains: events in
// transactions of perTx, payload random bytes each (neither TOAST's pglz
// nor a producer's codec can shrink them), spread over topics topics of
// partitions partitions (aggregate type t0, t1, ...), on 1,000 aggregates.
type backlog struct {
	events, perTx, payload, topics, partitions int
}

// relayPoint is what one drain measured.
type relayPoint struct {
	b         backlog
	rate      float64 // events/s, process start to the backlog confirmed
	mbps      float64 // payload MB/s
	cpu       float64 // relay CPU µs per event
	relayBusy float64 // share of one core
	wsBusy    float64 // the walsender's share of one core
	rss       float64 // peak RSS, MB
	window    float64 // the largest window of unacknowledged records seen
	spillMB   float64 // what the walsender's decoding spilled to disk
}

// point writes b as a backlog behind a slot of its own and drains it with
// a relay process (extra are more `relay run` flags), as the relay
// benchmark does, then clears the outbox for the next point.
func (r *relayCurves) point(ctx context.Context, b backlog, extra ...string) (p relayPoint, err error) {
	p.b = b
	r.n++
	slot := fmt.Sprintf("curves_%s_%d", r.suffix, r.n)
	prefix := fmt.Sprintf("curves.%s.%d.", r.suffix, r.n)
	topics := make([]string, b.topics)
	for i := range topics {
		topics[i] = prefix + "t" + strconv.Itoa(i)
	}
	resp, err := r.adm.CreateTopics(ctx, int32(b.partitions), 1, nil, topics...)
	if err == nil {
		err = resp.Error()
	}
	defer func() { _, _ = r.adm.DeleteTopics(context.Background(), topics...) }()
	if err != nil {
		return p, fmt.Errorf("create %d topics: %w", len(topics), err)
	}
	if _, err := r.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		return p, fmt.Errorf("create slot %s: %w", slot, err)
	}
	defer func() { _, _ = r.pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) }()
	start := time.Now()
	if err := r.writeBacklog(ctx, b); err != nil {
		return p, fmt.Errorf("write backlog %+v: %w", b, err)
	}
	log("curves: backlog of %d events, %d per transaction, %d-byte payloads, %d topics written in %s",
		b.events, b.perTx, b.payload, b.topics, time.Since(start).Round(time.Millisecond))
	// The insert position, not pg_current_wal_lsn (the write position):
	// with the backlog's commits not waiting for their flush, the last ones
	// may still lie beyond what is written.
	var target string
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&target); err != nil {
		return p, err
	}
	d, w, err := drainOnce(ctx, r.e, r.bin, r.url, r.pool, slot, prefix+"{aggregate_type}", target, extra...)
	if err != nil {
		return p, err
	}
	// Every event is in Kafka, once: a drain that skipped some would
	// look fast.
	ends, err := r.adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return p, fmt.Errorf("end offsets: %w", err)
	}
	var inKafka int64
	ends.Each(func(o kadm.ListedOffset) { inKafka += o.Offset })
	if inKafka != int64(b.events) {
		return p, fmt.Errorf("%d events drained, %d records in Kafka (relay log %s)", b.events, inKafka, filepath.Join(r.e.dir, slot+".log"))
	}
	secs := d.elapsed.Seconds()
	p.rate = float64(b.events) / secs
	p.mbps = float64(b.events) * float64(b.payload) / 1e6 / secs
	p.cpu = w.busy * secs / float64(b.events) * 1e6
	p.relayBusy, p.wsBusy, p.rss, p.window = w.busy, d.walsenderBusy(), w.peakRSS, w.windowPeak
	// The walsender reports its slot's statistics as it goes and when it
	// exits (the relay has stopped by now): wait until they are in.
	for range 50 {
		var txns, spill int64
		if err := r.pool.QueryRow(ctx, `SELECT coalesce(total_txns, 0), coalesce(spill_bytes, 0) FROM pg_stat_replication_slots WHERE slot_name = $1`,
			slot).Scan(&txns, &spill); err == nil && txns > 0 {
			p.spillMB = float64(spill) / 1e6
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	log("curves: %d events drained at %.0f events/s (%.1f MB/s), relay %.1f µs CPU per event (%.0f%% of a core), walsender %.0f%%, peak RSS %.1f MB, largest window %.0f, spilled %.1f MB %v",
		b.events, p.rate, p.mbps, p.cpu, p.relayBusy*100, p.wsBusy*100, p.rss, p.window, p.spillMB, extra)
	if _, err := r.pool.Exec(ctx, `TRUNCATE outbox`); err != nil {
		return p, err
	}
	return p, nil
}

// writeBacklog commits b's events in a server-side loop, a transaction per
// perTx events, without waiting for each commit's flush: a backlog of
// single-event transactions takes seconds, not minutes.
func (r *relayCurves) writeBacklog(ctx context.Context, b backlog) error {
	payload := make([]byte, b.payload)
	_, _ = rand.Read(payload)
	if _, err := r.pool.Exec(ctx, `TRUNCATE curves_payload`); err != nil {
		return err
	}
	if _, err := r.pool.Exec(ctx, `INSERT INTO curves_payload VALUES ($1)`, payload); err != nil {
		return err
	}
	txs := (b.events + b.perTx - 1) / b.perTx
	return ferrytest.ExecUnflushed(ctx, r.pool, fmt.Sprintf(`DO $$
DECLARE p bytea := (SELECT p FROM curves_payload);
BEGIN
	FOR t IN 0 .. %d LOOP
		INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT gen_random_uuid(), 't' || (i %% %d), 'agg-' || (i %% 1000), 'Changed', p, '{"k":"v"}'
		FROM generate_series(t * %d, least((t + 1) * %d, %d) - 1) i;
		COMMIT;
	END LOOP;
END $$`, txs-1, b.topics, b.perTx, b.perTx, b.events))
}

// relayColumns and relayRow are the relay sweeps' table, after the swept
// value.
var relayColumns = []string{"events", "drain events/s", "payload MB/s", "relay CPU per event", "relay / walsender, share of a core", "peak RSS", "largest unacked window"}

func relayRow(x string, p relayPoint) []string {
	return []string{x, count(float64(p.b.events)), count(p.rate), fmt.Sprintf("%.1f", p.mbps), fmt.Sprintf("%.1f µs", p.cpu),
		fmt.Sprintf("%.0f%% / %.0f%%", p.relayBusy*100, p.wsBusy*100), fmt.Sprintf("%.0f MB", p.rss), count(p.window)}
}

// relayCurve drains one backlog per swept value and tabulates them.
func relayCurve(ctx context.Context, r *relayCurves, xs []float64, xTick func(float64) string, run func(x float64) (relayPoint, error)) ([]relayPoint, [][]string, error) {
	var ps []relayPoint
	var rows [][]string
	for _, x := range xs {
		p, err := run(x)
		if err != nil {
			return nil, nil, err
		}
		ps = append(ps, p)
		rows = append(rows, relayRow(xTick(x), p))
	}
	return ps, rows, nil
}

func field(ps []relayPoint, f func(relayPoint) float64) []float64 {
	out := make([]float64, len(ps))
	for i, p := range ps {
		out[i] = f(p)
	}
	return out
}

func rateOf(p relayPoint) float64 { return p.rate }
func cpuOf(p relayPoint) float64  { return p.cpu }

// rateAndCPU charts a relay sweep's drain rate and its CPU per event.
func rateAndCPU(title, xLabel string, xs []float64, xTick func(float64) string, ps []relayPoint) chart {
	return chart{title: title, xLabel: xLabel, logX: true, xs: xs, xTick: xTick, series: []series{
		{name: "drain", unit: "events/s", ys: field(ps, rateOf)},
		{name: "relay CPU", unit: "µs per event", ys: field(ps, cpuOf), right: true},
	}}
}

func payloadCurve(ctx context.Context, r *relayCurves, scale float64) (*curve, error) {
	xs := []float64{100, 1 << 10, 16 << 10, 64 << 10, 256 << 10}
	target, most, least := 128e6*scale, scaled(200_000, scale), scaled(500, scale)
	ps, rows, err := relayCurve(ctx, r, xs, bytesLabel, func(x float64) (relayPoint, error) {
		n := min(most, max(least, int(target/x)))
		return r.point(ctx, backlog{events: n, perTx: 100, payload: int(x), topics: 1, partitions: 4})
	})
	if err != nil {
		return nil, err
	}
	c := &curve{name: "relay-payload", heading: "Relay: payload size",
		setup: fmt.Sprintf("A backlog of about %.0f MB of payload per point (at most %s and at least %s events), 100 events per transaction, one topic of 4 partitions, `--max-in-flight` at its default.",
			target/1e6, count(float64(most)), count(float64(least))),
		columns: append([]string{"payload"}, relayColumns...), rows: rows,
		chart: chart{title: "Relay drain rate and CPU per event against payload size", xLabel: "payload per event", logX: true, xs: xs, xTick: bytesLabel,
			series: []series{
				{name: "drain", unit: "payload MB/s", ys: field(ps, func(p relayPoint) float64 { return p.mbps })},
				{name: "relay CPU", unit: "µs per event", ys: field(ps, cpuOf), right: true},
			}}}
	rate, mbps, cpu := field(ps, rateOf), c.chart.series[0].ys, c.chart.series[1].ys
	c.bends = append(c.bends, holdsSentence("Events/s", rate, xs, bytesLabel, counted("events/s")))
	c.bends = append(c.bends, kneeSentence("Payload MB/s", mbps, xs, bytesLabel, func(v float64) string { return fmt.Sprintf("%.1f MB/s", v) }))
	if i := firstMove(cpu, +1, bendTolerance); i >= 0 {
		c.bends = append(c.bends, fmt.Sprintf("CPU per event grows by more than 10%% per step from %s on (%.1f µs there, %.1f µs at %s).",
			bytesLabel(xs[i]), cpu[i], cpu[len(cpu)-1], bytesLabel(xs[len(xs)-1])))
	}
	last := ps[len(ps)-1]
	c.bends = append(c.bends, fmt.Sprintf("At %s the relay ran at %.0f%% of a core and the walsender at %.0f%%; the window of unacknowledged records peaked at %s.",
		bytesLabel(xs[len(xs)-1]), last.relayBusy*100, last.wsBusy*100, count(last.window)))
	c.why = fmt.Sprintf("a small event costs the relay a fixed amount (decode a row, build a record, track its LSN, the ack), so while that cost "+
		"dominates, events/s stays put and MB/s grows with the payload. Above about 2 KB PostgreSQL stores a payload out of line (TOAST, 2 KB chunks the walsender "+
		"reassembles while decoding), and the bytes take over: each is copied by the walsender, the relay and the broker, a Kafka batch holds at most "+
		"max.message.bytes (%s by default, four 256 KiB records), and the relay's window holds at most %d MiB of unacknowledged records "+
		"(`MaxInFlightBytes`), which at 256 KiB is %d records, not %s; MB/s then levels off at what two cores copy.",
		bytesLabel(outbox.KafkaMaxMessageBytesDefault), relay.MaxInFlightBytesDefault>>20, relay.MaxInFlightBytesDefault/(256<<10), count(relay.MaxInFlightRecordsDefault))
	return c, nil
}

func perTxCurve(ctx context.Context, r *relayCurves, scale float64) (*curve, error) {
	total := scaled(100_000, scale)
	var xs []float64
	for _, k := range []float64{1, 10, 100, 1_000, 10_000, 100_000} {
		if int(k) <= total {
			xs = append(xs, k)
		}
	}
	ps, rows, err := relayCurve(ctx, r, xs, count, func(x float64) (relayPoint, error) {
		return r.point(ctx, backlog{events: total, perTx: int(x), payload: 200, topics: 1, partitions: 4})
	})
	if err != nil {
		return nil, err
	}
	var workMem string
	if err := r.pool.QueryRow(ctx, `SELECT current_setting('logical_decoding_work_mem')`).Scan(&workMem); err != nil {
		return nil, err
	}
	c := &curve{name: "relay-events-per-tx", heading: "Relay: events per transaction",
		setup:   fmt.Sprintf("%s events of 200 bytes per point, one topic of 4 partitions; the last column is what the walsender's decoding spilled to disk.", count(float64(total))),
		columns: append([]string{"events per transaction"}, append(relayColumns, "spilled to disk")...),
		chart:   rateAndCPU("Relay drain rate and CPU per event against events per transaction", "events per transaction", xs, count, ps)}
	for i, row := range rows {
		c.rows = append(c.rows, append(row, fmt.Sprintf("%.0f MB", ps[i].spillMB)))
	}
	rate, cpu := field(ps, rateOf), field(ps, cpuOf)
	c.bends = append(c.bends, kneeSentence("The drain rate", rate, xs, counts("event per transaction", "events per transaction"), counted("events/s")))
	if k := knee(cpu, -1, bendTolerance); k >= 0 {
		c.bends = append(c.bends, fmt.Sprintf("CPU per event falls until %s events per transaction (%.1f µs, from %.1f µs at %s), and no later point is more than 10%% below it.",
			count(xs[k]), cpu[k], cpu[0], count(xs[0])))
	} else if len(cpu) > 1 {
		c.bends = append(c.bends, fmt.Sprintf("CPU per event still falls by more than 10%% at the last step, from %.1f µs at %s to %.1f µs at %s.",
			cpu[0], count(xs[0]), cpu[len(cpu)-1], count(xs[len(xs)-1])))
	}
	spilled := -1
	for i, p := range ps {
		if p.spillMB > 0 {
			spilled = i
			break
		}
	}
	if spilled >= 0 {
		c.bends = append(c.bends, fmt.Sprintf("From %s events per transaction the walsender spilled to disk (%.0f MB at %s): the transaction outgrew logical_decoding_work_mem (%s here).",
			count(xs[spilled]), ps[len(ps)-1].spillMB, count(xs[len(xs)-1]), workMem))
	} else {
		c.bends = append(c.bends, fmt.Sprintf("No transaction spilled to disk (logical_decoding_work_mem %s).", workMem))
	}
	c.why = "every transaction costs a BEGIN and a COMMIT message, a commit LSN the relay tracks until Kafka acknowledges all its records, " +
		"and a position to confirm, so small transactions pay that per event; once a transaction holds some hundreds of events that cost is spread thin. " +
		"PostgreSQL decodes a transaction only at its commit, holding its changes in memory up to logical_decoding_work_mem and spilling the rest to disk " +
		"(and reading it back), and the relay can confirm nothing inside a transaction, so very large ones bring the spill and a burst at the commit rather than speed."
	return c, nil
}

func topicsCurve(ctx context.Context, r *relayCurves, scale float64) (*curve, error) {
	events := scaled(50_000, scale)
	xs := []float64{1, 10, 100, 1_000}
	ps, rows, err := relayCurve(ctx, r, xs, count, func(x float64) (relayPoint, error) {
		return r.point(ctx, backlog{events: events, perTx: 100, payload: 200, topics: int(x), partitions: 1})
	})
	if err != nil {
		return nil, err
	}
	c := &curve{name: "relay-topics", heading: "Relay: number of topics",
		setup: fmt.Sprintf("%s events of 200 bytes per point, 100 per transaction, spread round-robin over the topics (one aggregate type each, "+
			"`--topic-template` with `{aggregate_type}`), every topic made ahead with one partition.", count(float64(events))),
		columns: append([]string{"topics"}, relayColumns...), rows: rows,
		chart: rateAndCPU("Relay drain rate and CPU per event against the number of topics", "topics (one partition each)", xs, count, ps)}
	rate, cpu := field(ps, rateOf), field(ps, cpuOf)
	c.bends = append(c.bends, holdsSentence("The drain rate", rate, xs, counts("topic", "topics"), counted("events/s")))
	if i := firstMove(cpu, +1, bendTolerance); i >= 0 {
		c.bends = append(c.bends, fmt.Sprintf("CPU per event grows by more than 10%% per step from %s topics on (%.1f µs there, %.1f µs at %s).",
			count(xs[i]), cpu[i], cpu[len(cpu)-1], count(xs[len(xs)-1])))
	}
	for i, p := range ps {
		if p.window >= relay.MaxInFlightRecordsDefault {
			c.bends = append(c.bends, fmt.Sprintf("From %s topics on, the window of unacknowledged records reached its limit (%s): the relay waited on Kafka's acknowledgements, not on PostgreSQL.",
				count(xs[i]), count(relay.MaxInFlightRecordsDefault)))
			break
		}
	}
	c.why = "every point starts a relay that knows no topic, and a topic's first record waits twice: for the relay's DescribeConfigs of its " +
		"max.message.bytes (a round trip in the send path) and for franz-go's metadata on the topic (a record to a topic the client has no metadata " +
		"for waits for a metadata request). With the events round-robin over the topics, at 1,000 topics the first 1,000 events each open one: " +
		"a start-up cost, which a long-running relay pays once per topic, not per event (this sweep does not separate the two: " +
		"each point is a fresh process). Past it, franz-go keeps a batch per partition: " +
		"the same events over more partitions make more, smaller batches, more batch headers per produce request and more logs for the broker to append to."
	return c, nil
}

func inFlightCurve(ctx context.Context, r *relayCurves, scale float64) (*curve, error) {
	// A small window drains slowly: its backlog is smaller, 200 windows'
	// worth at most.
	most := 200_000
	xs := []float64{100, 1_000, 10_000, 100_000}
	ps, rows, err := relayCurve(ctx, r, xs, count, func(x float64) (relayPoint, error) {
		events := scaled(min(most, 200*int(x)), scale)
		return r.point(ctx, backlog{events: events, perTx: 100, payload: 200, topics: 1, partitions: 4}, "--max-in-flight", strconv.Itoa(int(x)))
	})
	if err != nil {
		return nil, err
	}
	c := &curve{name: "relay-max-in-flight", heading: "Relay: `--max-in-flight`, and its RSS",
		setup: fmt.Sprintf("%s events of 200 bytes per point (200 windows' worth where that is fewer), 100 per transaction, one topic of 4 partitions; "+
			"`--max-in-flight` bounds the records sent and not yet acknowledged.", count(float64(scaled(most, scale)))),
		columns: append([]string{"--max-in-flight"}, relayColumns...), rows: rows,
		chart: chart{title: "Relay drain rate and peak RSS against --max-in-flight", xLabel: "--max-in-flight (records)", logX: true, xs: xs, xTick: count,
			series: []series{
				{name: "drain", unit: "events/s", ys: field(ps, rateOf)},
				{name: "peak RSS", unit: "MB", ys: field(ps, func(p relayPoint) float64 { return p.rss }), right: true},
			}}}
	rate := field(ps, rateOf)
	c.bends = append(c.bends, kneeSentence("The drain rate", rate, xs, counted("in flight"), counted("events/s")))
	c.bends = append(c.bends, fmt.Sprintf("Peak RSS goes from %.0f MB at %s to %.0f MB at %s.", ps[0].rss, count(xs[0]), ps[len(ps)-1].rss, count(xs[len(xs)-1])))
	for i, p := range ps {
		if p.window < 0.9*xs[i] {
			c.bends = append(c.bends, fmt.Sprintf("From %s on the window never filled (largest seen %s): the limit stopped binding there.", count(xs[i]), count(p.window)))
			break
		}
	}
	c.why = fmt.Sprintf("the relay reads on only while fewer records than the limit await Kafka's acknowledgement. A window smaller than what flows in one "+
		"produce round trip (the 1 ms linger plus the broker's append and ack) leaves the reader waiting on acks; once the window "+
		"covers a round trip, raising it buys nothing and only holds more records, each kept until its ack, hence the RSS. The window is also bounded by "+
		"%d MiB of records (`MaxInFlightBytes`), and a 200-byte event's record is a few hundred bytes, so the byte bound does not bind here.",
		relay.MaxInFlightBytesDefault>>20)
	return c, nil
}

// workerPoint runs one worker sweep point on wt from fresh tables.
func workerPoint(ctx context.Context, e *env, wt *workerTopic, i, n int, s workerShape) (float64, error) {
	if err := resetWorkerTables(ctx, wt.pool); err != nil {
		return 0, err
	}
	r, err := workerOnce(ctx, e, wt.pool, wt.topic, fmt.Sprintf("curve_%d", i), n, s)
	if err != nil {
		return 0, err
	}
	log("curves: worker %+v: %.0f msg/s", s, r)
	return r, nil
}

// workerSweep measures the worker at each shape, on a new topic (and
// database) whenever a shape's partitions or keys differ from the previous
// one's.
func workerSweep(ctx context.Context, e *env, n int, shapes []workerShape) ([]float64, error) {
	var out []float64
	var wt *workerTopic
	defer func() {
		if wt != nil {
			wt.close()
		}
	}()
	conns := 2
	for _, s := range shapes {
		conns = max(conns, s.concurrency+2)
	}
	for i, s := range shapes {
		if i == 0 || s.partitions != shapes[i-1].partitions || s.keys != shapes[i-1].keys {
			if wt != nil {
				wt.close()
			}
			var err error
			if wt, err = newWorkerTopic(ctx, e, s, n, conns); err != nil {
				return nil, err
			}
		}
		r, err := workerPoint(ctx, e, wt, i, n, s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func workerRows(xs []float64, xTick func(float64) string, rates ...[]float64) [][]string {
	var rows [][]string
	for i, x := range xs {
		row := []string{xTick(x)}
		for _, r := range rates {
			row = append(row, count(r[i]))
		}
		rows = append(rows, row)
	}
	return rows
}

// sweepWorker varies one setting of base over xs.
func sweepWorker(ctx context.Context, e *env, n int, base workerShape, xs []float64, set func(*workerShape, int)) ([]float64, error) {
	shapes := make([]workerShape, len(xs))
	for i, x := range xs {
		shapes[i] = base
		set(&shapes[i], int(x))
	}
	return workerSweep(ctx, e, n, shapes)
}

func workerChart(title, xLabel string, xs []float64, ss ...series) chart {
	return chart{title: title, xLabel: xLabel, logX: true, xs: xs, xTick: count, series: ss}
}

// workerDefaults is inbox.Config's defaults, on the benchmark's accounts.
var workerDefaults = workerShape{partitions: 8, concurrency: 8, keyConcurrency: 1, batch: 16, keys: workerAccounts}

// oneSetting is a worker sweep of one setting of base, drawn as one
// series: where its throughput stops rising is the bend.
type oneSetting struct {
	name, setting, unitOne, unitMany, setup, why string
	n                                            int // messages per point
	base                                         workerShape
	xs                                           []float64
	set                                          func(*workerShape, int)
}

func (o oneSetting) curve(ctx context.Context, e *env) (*curve, error) {
	rates, err := sweepWorker(ctx, e, o.n, o.base, o.xs, o.set)
	if err != nil {
		return nil, err
	}
	xLabel := o.setting
	if o.unitMany != o.setting {
		xLabel += " (" + o.unitMany + ")"
	}
	return &curve{name: o.name, heading: "Worker: " + o.setting,
		setup:   fmt.Sprintf("%s messages per point, %s.", count(float64(o.n)), o.setup),
		columns: []string{o.setting, "worker msg/s"}, rows: workerRows(o.xs, count, rates),
		chart: workerChart("Worker throughput against "+o.setting, xLabel, o.xs, series{name: "worker", unit: "messages/s", ys: rates}),
		bends: []string{kneeSentence("Throughput", rates, o.xs, counts(o.unitOne, o.unitMany), msgs)},
		why:   o.why}, nil
}

func partitionsCurve(ctx context.Context, e *env, scale float64) (*curve, error) {
	return oneSetting{name: "worker-partitions", setting: "partitions", unitOne: "partition", unitMany: "partitions",
		n: scaled(10_000, scale), base: workerDefaults, xs: []float64{1, 2, 4, 8, 16}, set: func(s *workerShape, x int) { s.partitions = x },
		setup: fmt.Sprintf("one UPDATE each, the worker at inbox.Config's defaults (concurrency %d, key concurrency 1, batch size %d)",
			workerDefaults.concurrency, workerDefaults.batch),
		why: fmt.Sprintf("one partition is applied in offset order, one transaction at a time (key concurrency 1), so partitions are the worker's "+
			"parallelism up to its concurrency (%d): past it more partitions only queue. Before that, PostgreSQL's commits are the bound: every transaction "+
			"waits for its WAL flush, and concurrent ones share a flush (group commit) only as far as two cores and one disk allow.", workerDefaults.concurrency),
	}.curve(ctx, e)
}

func concurrencyCurve(ctx context.Context, e *env, scale float64) (*curve, error) {
	base := workerDefaults
	base.partitions = 32
	return oneSetting{name: "worker-concurrency", setting: "concurrency", unitOne: "transaction in flight", unitMany: "transactions in flight",
		n: scaled(10_000, scale), base: base, xs: []float64{1, 2, 4, 8, 16, 32}, set: func(s *workerShape, x int) { s.concurrency = x },
		setup: fmt.Sprintf("%d partitions (so that partitions never limit it), batch size %d, key concurrency 1", base.partitions, base.batch),
		why: "each transaction in flight spends most of its time waiting: on PostgreSQL's round trips and on its commit's WAL flush. More of them " +
			"overlap those waits and share flushes (group commit) until the machine's two cores are busy with the statements themselves " +
			"(PostgreSQL's backends, the Go worker and the broker all on them); past that more transactions only queue for the CPU and for locks.",
	}.curve(ctx, e)
}

func keyConcurrencyCurve(ctx context.Context, e *env, scale float64) (*curve, error) {
	n := scaled(4_000, scale)
	xs := []float64{1, 2, 4, 8}
	const fewKeys = 4
	base := workerShape{partitions: 1, concurrency: 8, batch: 1, keys: workerAccounts}
	many, err := sweepWorker(ctx, e, n, base, xs, func(s *workerShape, x int) { s.keyConcurrency = x })
	if err != nil {
		return nil, err
	}
	base.keys = fewKeys
	few, err := sweepWorker(ctx, e, n, base, xs, func(s *workerShape, x int) { s.keyConcurrency = x })
	if err != nil {
		return nil, err
	}
	c := &curve{name: "worker-key-concurrency", heading: "Worker: key concurrency",
		setup: fmt.Sprintf("%s messages per point on one partition (so that keys are the only parallelism), concurrency %d, batch size 1, "+
			"keyed over %s accounts or over %d.", count(float64(n)), base.concurrency, count(workerAccounts), fewKeys),
		columns: []string{"key concurrency", fmt.Sprintf("worker msg/s, %s keys", count(workerAccounts)), fmt.Sprintf("worker msg/s, %d keys", fewKeys)},
		rows:    workerRows(xs, count, many, few),
		chart: workerChart("Worker throughput against key concurrency", "key concurrency (lanes per partition)", xs,
			series{name: count(workerAccounts) + " keys", unit: "messages/s", ys: many},
			series{name: strconv.Itoa(fewKeys) + " keys", unit: "messages/s", ys: few})}
	c.bends = append(c.bends,
		kneeSentence(fmt.Sprintf("With %s keys, throughput", count(workerAccounts)), many, xs, counts("lane", "lanes"), msgs),
		kneeSentence(fmt.Sprintf("With %d keys, it", fewKeys), few, xs, counts("lane", "lanes"), msgs))
	c.why = fmt.Sprintf("lanes are picked by a hash of the key, and a lane applies its messages in order, so a partition runs at most as many "+
		"transactions at once as it has busy lanes: with many keys every lane has work and key concurrency acts like more partitions, up to the "+
		"worker's concurrency (%d) and the commit rate; with %d keys at most %d lanes have work, fewer where two keys hash to one lane, so "+
		"lanes beyond that add nothing.", base.concurrency, fewKeys, fewKeys)
	return c, nil
}

func batchCurve(ctx context.Context, e *env, scale float64) (*curve, error) {
	return oneSetting{name: "worker-batch-size", setting: "batch size", unitOne: "message per transaction", unitMany: "messages per transaction",
		n: scaled(20_000, scale), base: workerDefaults, xs: []float64{1, 4, 16, 64, 256}, set: func(s *workerShape, x int) { s.batch = x },
		setup: fmt.Sprintf("%d partitions, concurrency %d, key concurrency 1; a batch holds what was fetched and not applied yet, a savepoint per message",
			workerDefaults.partitions, workerDefaults.concurrency),
		why: "a batch shares one transaction's BEGIN, inbox insert (one statement for the batch) and commit flush among its messages, so the per-message " +
			"cost falls towards what each message still pays alone: its savepoint, the handler's UPDATE and their round trips. Once that dominates, " +
			"larger batches save little, and a batch can hold only what one partition has fetched and not yet applied.",
	}.curve(ctx, e)
}

var msgs = counted("msg/s")

// counted prints a count followed by its unit.
func counted(unit string) func(float64) string {
	return func(v float64) string { return count(v) + " " + unit }
}

// counts prints a count followed by its unit, singular for one.
func counts(one, many string) func(float64) string {
	return func(v float64) string {
		if count(v) == "1" {
			return "1 " + one
		}
		return count(v) + " " + many
	}
}

// holdsSentence says up to where a curve holds within bendTolerance per
// step before it falls by more.
func holdsSentence(what string, ys, xs []float64, xTick, value func(float64) string) string {
	last := len(ys) - 1
	switch i := firstMove(ys, -1, bendTolerance); {
	case len(ys) < 2:
		return ""
	case i < 0:
		return fmt.Sprintf("%s holds within 10%% per step across the range, %s at %s and %s at %s.", what, value(ys[0]), xTick(xs[0]), value(ys[last]), xTick(xs[last]))
	case i == 0:
		return fmt.Sprintf("%s falls by more than 10%% from the first step on: %s at %s, %s at %s, %s at %s.", what,
			value(ys[0]), xTick(xs[0]), value(ys[1]), xTick(xs[1]), value(ys[last]), xTick(xs[last]))
	default:
		return fmt.Sprintf("%s holds within 10%% per step up to %s (%s) and falls from there, to %s at %s.", what,
			xTick(xs[i]), value(ys[i]), value(ys[last]), xTick(xs[last]))
	}
}

// scaled is n times scale, at least 1.
func scaled(n int, scale float64) int { return max(1, int(math.Round(float64(n)*scale))) }

// moves reports whether b is more than tol (a share) beyond a in direction
// dir: up when dir > 0, down otherwise.
func moves(a, b float64, dir int, tol float64) bool {
	if dir > 0 {
		return b > a*(1+tol)
	}
	return b < a*(1-tol)
}

// knee is the index of the point where a curve stops moving in direction
// dir: the first point that no later point beats by more than tol (a share
// of it), so that one noisy dip does not pass for the bend. -1 when even the
// last step moves more.
func knee(ys []float64, dir int, tol float64) int {
	for i := 0; i+1 < len(ys); i++ {
		beaten := false
		for _, y := range ys[i+1:] {
			beaten = beaten || moves(ys[i], y, dir, tol)
		}
		if !beaten {
			return i
		}
	}
	return -1
}

// firstMove is the index of the point where a curve starts moving in
// direction dir: the first point from which the next one moves by more than
// tol. -1 when no step does.
func firstMove(ys []float64, dir int, tol float64) int {
	for i := 0; i+1 < len(ys); i++ {
		if moves(ys[i], ys[i+1], dir, tol) {
			return i
		}
	}
	return -1
}

// kneeSentence says where a rising curve stops rising (its knee), and
// where it peaks when it falls after.
func kneeSentence(what string, ys, xs []float64, xTick func(float64) string, value func(float64) string) string {
	k := knee(ys, +1, bendTolerance)
	var s string
	switch {
	case len(ys) == 0:
		return ""
	case k < 0:
		return fmt.Sprintf("%s still rises by more than 10%% at the last step, from %s at %s to %s at %s: no bend in this range.",
			what, value(ys[0]), xTick(xs[0]), value(ys[len(ys)-1]), xTick(xs[len(xs)-1]))
	case k == 0:
		s = fmt.Sprintf("%s never gains more than 10%% on its first point, %s at %s", what, value(ys[0]), xTick(xs[0]))
	default:
		s = fmt.Sprintf("%s rises up to %s (%s, %.1fx the %s at %s), and no later point is more than 10%% above it", what, xTick(xs[k]), value(ys[k]),
			ys[k]/ys[0], value(ys[0]), xTick(xs[0]))
	}
	peak := 0
	for i, y := range ys {
		if y > ys[peak] {
			peak = i
		}
	}
	if last := len(ys) - 1; peak < last && ys[last] < ys[peak]*(1-bendTolerance) {
		s += fmt.Sprintf("; it peaks at %s (%s) and falls to %s at %s", xTick(xs[peak]), value(ys[peak]), value(ys[last]), xTick(xs[last]))
	}
	return s + "."
}

// count prints a number rounded to an integer, with thousands separated by
// commas.
func count(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// bytesLabel prints a size in B, KiB or MiB.
func bytesLabel(v float64) string {
	switch {
	case v >= 1<<20:
		return strconv.FormatFloat(v/(1<<20), 'g', 3, 64) + " MiB"
	case v >= 1<<10:
		return strconv.FormatFloat(v/(1<<10), 'g', 3, 64) + " KiB"
	default:
		return strconv.FormatFloat(v, 'g', 4, 64) + " B"
	}
}
