package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// shapesOpts is `ferrybench shapes`: the relay's drain of a backlog
// written in transactions of each shape, against the walsender's own bound
// in that drain (its share of the drain on a core), and beside a client
// that streams the same WAL with the same plugin options, reads as the
// relay does, in batches, and discards every change (walsenderOnce), in
// the same rounds.
type shapesOpts struct {
	events    int
	shapes    []int
	runs      int
	onePerTx  int // rounds of the one-event-per-transaction shape: the slow-state check
	payload   int
	relayArgs []string
	relayEnv  []string
	relayBin  string
	label     string
}

// shapeResult is one shape's rounds.
type shapeResult struct {
	perTx                int
	walsender, relay     samples // events/s: the discarding client's drain, the relay's
	ratio                samples // relay / the discarding client, paired per round
	own                  samples // relay / the walsender's own bound: its share of the drain on a core
	noCore, neither      samples // the rest of the walsender's time in the relay's drain: runnable without a core; neither
	relayCost, relayBusy samples // µs of relay CPU per event, its share of a core
}

func runShapes(ctx context.Context, fs *flag.FlagSet, args []string) error {
	var o shapesOpts
	parsed := shapesFlags(fs, &o, "")
	relayArgs := fs.String("relay-args", "", "extra arguments of the relay's run command, space-separated")
	relayEnv := fs.String("relay-env", "", "extra environment of the relay process, space-separated NAME=VALUE (e.g. GOMAXPROCS=2)")
	fs.StringVar(&o.relayBin, "relay-bin", "", "relay binary to run (default: built from this tree)")
	fs.StringVar(&o.label, "label", "", "names this configuration in the output")
	_ = fs.Parse(args)
	if err := parsed(); err != nil {
		return err
	}
	o.relayArgs, o.relayEnv = strings.Fields(*relayArgs), strings.Fields(*relayEnv)
	return withEnv(func(e *env) error {
		e.environ = append(e.environ, o.relayEnv...)
		md, err := benchShapes(ctx, e, o)
		fmt.Print(md)
		return err
	})
}

// shapesFlags registers the sizes of the shapes benchmark, each flag's
// name after prefix (`all` runs it as part of make bench with "shapes-");
// the function it returns checks them once the flags are parsed.
func shapesFlags(fs *flag.FlagSet, o *shapesOpts, prefix string) func() error {
	fs.IntVar(&o.events, prefix+"events", 100_000, "backlog of each shape, in events")
	shapes := fs.String(prefix+"shapes", "1,3,10,100,1000", "events per transaction of each backlog")
	fs.IntVar(&o.runs, prefix+"runs", 3, "rounds of each shape: the discarding client, then the relay, each on a slot of its own made before the backlog")
	fs.IntVar(&o.onePerTx, prefix+"one-per-tx-runs", 7, "rounds of the one-event-per-transaction shape, in a row: how far the slowest and fastest stray from their median (at least -"+prefix+"runs)")
	fs.IntVar(&o.payload, prefix+"payload", 200, "payload bytes per event")
	return func() error {
		o.shapes = nil
		for _, f := range strings.Split(*shapes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("-%sshapes: %q is not a positive number of events per transaction", prefix, f)
			}
			o.shapes = append(o.shapes, n)
		}
		if o.runs < 1 || o.events < 1 {
			return fmt.Errorf("-%sruns %d, -%sevents %d: want at least 1 of each", prefix, o.runs, prefix, o.events)
		}
		if o.onePerTx < 0 {
			return fmt.Errorf("-%sone-per-tx-runs %d: want 0 or more (fewer than -%sruns means -%sruns)", prefix, o.onePerTx, prefix, prefix)
		}
		return nil
	}
}

// benchShapes drains each shape's backlog o.rounds(shape) times and
// returns its table.
func benchShapes(ctx context.Context, e *env, o shapesOpts) (string, error) {
	bin := o.relayBin
	if bin == "" {
		var err error
		if bin, err = e.build("github.com/ferryhq/ferry/cmd/relay", "relay"); err != nil {
			return "", err
		}
	}
	var rs []*shapeResult
	for _, k := range o.shapes {
		r, err := shapeRounds(ctx, e, bin, o, k)
		if err != nil {
			return "", fmt.Errorf("%d events per transaction: %w", k, err)
		}
		rs = append(rs, r)
	}
	return shapesMarkdown(o, rs), nil
}

// rounds is how many times a shape of perTx events per transaction is
// drained.
func (o shapesOpts) rounds(perTx int) int {
	if perTx == 1 {
		return max(o.runs, o.onePerTx)
	}
	return o.runs
}

// shapeRounds writes a backlog of o.events in transactions of perTx
// events and drains it o.rounds(perTx) times with each of the walsender's
// bound and the relay, in turn.
func shapeRounds(ctx context.Context, e *env, bin string, o shapesOpts, perTx int) (*shapeResult, error) {
	runs := o.rounds(perTx)
	ds, err := newDrainSetup(ctx, e, "bench_shapes")
	if err != nil {
		return nil, err
	}
	defer ds.close()
	url, pool := ds.url, ds.pool
	suffix := ferrytest.Suffix()
	wsSlot := func(i int) string { return fmt.Sprintf("bench_%s_ws_%d", suffix, i) }
	relaySlot := func(i int) string { return fmt.Sprintf("bench_%s_relay_%d", suffix, i) }
	topic := func(i int) string { return fmt.Sprintf("bench.%s.%d.shape", suffix, i) }
	var slotNames []string
	for i := range runs {
		slotNames = append(slotNames, wsSlot(i), relaySlot(i))
		if err := ds.topics(ctx, topic(i)); err != nil {
			return nil, err
		}
	}
	if err := ds.slots(ctx, slotNames...); err != nil {
		return nil, err
	}
	log("%d events per transaction: writing a backlog of %d events", perTx, o.events)
	start := time.Now()
	if err := writeShapedBacklog(ctx, pool, o.events, perTx, o.payload); err != nil {
		return nil, err
	}
	log("%d events per transaction: backlog written in %s", perTx, time.Since(start).Round(time.Millisecond))
	var target string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		return nil, err
	}
	r := &shapeResult{perTx: perTx}
	for i := range runs {
		ws, err := walsenderOnce(ctx, url, pool, wsSlot(i), target)
		if err != nil {
			return nil, err
		}
		d, w, err := drainOnce(ctx, e, bin, url, pool, relaySlot(i), topic(i), target, o.relayArgs...)
		if err != nil {
			return nil, err
		}
		wsRate, relayRate := float64(o.events)/ws.elapsed.Seconds(), float64(o.events)/d.elapsed.Seconds()
		r.walsender, r.relay = append(r.walsender, wsRate), append(r.relay, relayRate)
		r.ratio = append(r.ratio, relayRate/wsRate)
		on, noCore, neither := d.walsenderTime()
		r.own, r.noCore, r.neither = append(r.own, on), append(r.noCore, noCore), append(r.neither, neither)
		r.relayBusy = append(r.relayBusy, w.busy)
		r.relayCost = append(r.relayCost, w.busy*d.elapsed.Seconds()/float64(o.events)*1e6)
		dOn, dNo, dNeither := pct(d.walsenderTime)
		wOn, wNo, wNeither := pct(ws.walsenderTime)
		log("%d events per transaction, round %d: discarding client %.0f events/s, relay %.0f (%.2f of it, %.2f of the walsender's own bound; relay %.0f%% of a core, its threads runnable without one %.0f ms/s, held by its window %.0f%% of the time; "+
			"per 1000 events: %.0f socket reads, %.0f WAL messages, %.0f produce requests; its walsender on a core / waiting for one / neither %.0f/%.0f/%.0f%%, %.1f µs per event; the client's %.0f/%.0f/%.0f%%, %.1f µs)",
			perTx, i+1, wsRate, relayRate, relayRate/wsRate, on, w.busy*100, w.noCore*1000, w.held()*100,
			w.counts.reads/float64(o.events)*1000, w.counts.wal/float64(o.events)*1000, w.counts.produces/float64(o.events)*1000,
			dOn, dNo, dNeither, d.cpu/float64(o.events)*1e6, wOn, wNo, wNeither, ws.cpu/float64(o.events)*1e6)
	}
	return r, nil
}

// writeShapedBacklog commits n events in transactions of perTx (the last
// one may be smaller), from one session without waiting for each commit's
// flush: the backlog's shape is what is measured, not how fast it was
// written. Its events are of aggregate type "load", keyed agg-0 to agg-999.
func writeShapedBacklog(ctx context.Context, pool *pgxpool.Pool, n, perTx, payload int) error {
	return writeBacklog(ctx, pool, outboxEvents{n: n, perTx: perTx, payload: payload, aggregateType: "load", keyPrefix: "agg-", keys: 1000})
}

// outboxEvents are what writeBacklog commits: n events of aggregateType in
// transactions of perTx, the i-th keyed keyPrefix followed by i % keys.
type outboxEvents struct {
	n, perTx, payload int
	aggregateType     string
	keyPrefix         string
	keys              int
}

// writeBacklog commits b from one session without waiting for each
// commit's flush.
func writeBacklog(ctx context.Context, pool *pgxpool.Pool, b outboxEvents) error {
	if _, err := pool.Exec(ctx, `
		CREATE OR REPLACE PROCEDURE bench_backlog(n int, per_tx int, payload int, agg_type text, key_prefix text, keys int) LANGUAGE plpgsql AS $$
		DECLARE
			written int := 0;
		BEGIN
			WHILE written < n LOOP
				INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
				SELECT gen_random_uuid(), agg_type, key_prefix || ((written + g) % keys), 'Changed',
					convert_to(repeat('x', payload), 'UTF8'), '{"k":"v"}'
				FROM generate_series(1, least(per_tx, n - written)) g;
				written := written + per_tx;
				COMMIT;
			END LOOP;
		END $$`); err != nil {
		return err
	}
	return ferrytest.ExecUnflushed(ctx, pool, `CALL bench_backlog($1, $2, $3, $4, $5, $6)`, b.n, b.perTx, b.payload, b.aggregateType, b.keyPrefix, b.keys)
}

func shapesMarkdown(o shapesOpts, rs []*shapeResult) string {
	var b strings.Builder
	config := "`relay run` with its defaults"
	if len(o.relayArgs)+len(o.relayEnv) > 0 {
		config = fmt.Sprintf("`relay run %s` with %s", strings.Join(o.relayArgs, " "), strings.Join(slices.Concat(o.relayEnv, []string{"its defaults"}), ", "))
	}
	if o.label != "" {
		config = o.label + ": " + config
	}
	rounds := fmt.Sprintf("%d rounds", o.runs)
	if slices.Contains(o.shapes, 1) && o.rounds(1) != o.runs {
		rounds += fmt.Sprintf(" (%d of one event per transaction)", o.rounds(1))
	}
	fmt.Fprintf(&b, "#### Drain by transaction shape: %s; %d events of %d-byte payloads per shape, 4 partitions; median (min–max) of %s\n\n", config, o.events, o.payload, rounds)
	b.WriteString("Each round drains the same backlog twice, from slots made before it: a client that reads as the relay does (in batches, behind the same read window), discards every change and confirms as the relay does, then the relay into Kafka as a real process. Both are timed from their start until the slot confirmed the backlog's end. " +
		"The walsender's own bound is what it would have streamed in the relay's drain had it been on a core all the time it streamed, at the CPU per event it spent there: the relay's drain over it is the walsender's share of that time on a core (`/proc/PID/schedstat`), and no client can pass it. " +
		"The rest of its time it was runnable but waiting for a core (the relay, the broker and the other processes held both), or neither (its socket full: waiting on the relay; or on WAL or I/O). " +
		"The discarding client is not a bound: the walsender spends less per event when its client reads later, in larger batches, so either can come out ahead. Ratios are paired within a round.\n\n")
	b.WriteString("| events per transaction | relay, events/s | **relay / the walsender's own bound** | its walsender runnable without a core / neither | relay CPU per event | relay's share of a core | discarding client, events/s | relay / discarding client |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %d | %s | **%s** | %s / %s%% | %s µs | %s | %s | %s |\n", r.perTx, r.relay.Format("%.0f"), r.own.Format("%.2f"),
			scale(r.noCore, 100).Format("%.0f"), scale(r.neither, 100).Format("%.0f"),
			r.relayCost.Format("%.1f"), r.relayBusy.Format("%.2f"), r.walsender.Format("%.0f"), r.ratio.Format("%.2f"))
	}
	for _, r := range rs {
		if r.perTx != 1 || len(r.relay) < 2 {
			continue
		}
		med, lo, hi := r.relay.Median(), r.relay.Min(), r.relay.Max()
		fmt.Fprintf(&b, "\nOne event per transaction, %d rounds in a row: %.0f to %.0f events/s, every round within %.0f%% of the median (%.0f).\n",
			len(r.relay), lo, hi, max(med-lo, hi-med)/med*100, med)
	}
	return b.String()
}

// pct is a three-way split of time as percentages.
func pct(split func() (a, b, c float64)) (float64, float64, float64) {
	a, b, c := split()
	return a * 100, b * 100, c * 100
}
