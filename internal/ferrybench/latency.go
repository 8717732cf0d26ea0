package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/outbox"
)

// latencyOpts are the settings of `ferrybench latency`.
type latencyOpts struct {
	rate, runs, partitions, payload, writers int
	duration, warmup                         time.Duration
	relayBin, relayArgs, relayEnv            string
	fetchMaxWait                             time.Duration // the plain consumer's
	workerFetchMaxWait                       time.Duration // 0: the worker's default
	workerBatch, workerConcurrency           int           // 0: the worker's defaults
	label                                    string
}

func latencyFlags(fs *flag.FlagSet) *latencyOpts {
	o := &latencyOpts{}
	fs.IntVar(&o.rate, "rate", 1000, "events per second offered, one event per transaction")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "length of each measured phase")
	fs.DurationVar(&o.warmup, "warmup", 5*time.Second, "load before each measured phase, not counted (the consumers join, the broker warms up)")
	fs.IntVar(&o.runs, "runs", 3, "measured runs, each on a fresh database, slot, topic and relay; medians are reported")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions of the topic")
	fs.IntVar(&o.payload, "payload", 200, "payload bytes per event")
	fs.IntVar(&o.writers, "writers", 8, "application connections committing the events")
	fs.StringVar(&o.relayBin, "relay-bin", "", "relay binary to run (default: built from this tree)")
	fs.StringVar(&o.relayArgs, "relay-args", "", "extra arguments of the relay's run command, space-separated")
	fs.StringVar(&o.relayEnv, "relay-env", "", "extra environment of the relay process, space-separated NAME=VALUE (e.g. GOMAXPROCS=1)")
	fs.DurationVar(&o.fetchMaxWait, "fetch-max-wait", 500*time.Millisecond, "FetchMaxWait of the plain consumer (500ms: Kafka's default)")
	fs.DurationVar(&o.workerFetchMaxWait, "worker-fetch-max-wait", 0, "FetchMaxWait given to the worker in KafkaOpts (0: the worker's default)")
	fs.IntVar(&o.workerBatch, "worker-batch", 0, "the worker's BatchSize (0: its default)")
	fs.IntVar(&o.workerConcurrency, "worker-concurrency", 0, "the worker's Concurrency (0: its default)")
	fs.StringVar(&o.label, "label", "", "names this configuration in the output")
	return o
}

// benchLatency measures Ferry end to end at a steady rate: from the
// application's commit returning to (a) a plain Kafka consumer fetching the
// record and (b) an inbox.Worker whose handler writes one row committing
// its effect; with the stages between them, so that the tail can be placed.
func benchLatency(ctx context.Context, o *latencyOpts, out io.Writer) error {
	return withEnv(func(e *env) error {
		bin := o.relayBin
		if bin == "" {
			var err error
			if bin, err = e.build("github.com/ferryhq/ferry/cmd/relay", "relay"); err != nil {
				return err
			}
		}
		rs, err := latencyRuns(ctx, e, bin, o)
		if err != nil {
			return err
		}
		_, err = io.WriteString(out, latencyMarkdown(o, rs))
		return err
	})
}

// latencyRuns measures o.runs runs of o, one after the other.
func latencyRuns(ctx context.Context, e *env, bin string, o *latencyOpts) ([]*latencyResult, error) {
	var rs []*latencyResult
	for i := range o.runs {
		r, err := latencyRun(ctx, e, bin, o)
		if err != nil {
			return nil, err
		}
		log("latency run %d at %d events/s: commit->fetch p50 %s p99 %s; commit->effect p50 %s p99 %s; %.0f events/s offered; machine %.0f%% busy",
			i+1, o.rate, ms(r.q(stageCommitFetch, .5)), ms(r.q(stageCommitFetch, .99)),
			ms(r.q(stageCommitEffect, .5)), ms(r.q(stageCommitEffect, .99)), r.achieved, r.box*100)
		rs = append(rs, r)
	}
	return rs, nil
}

// e2eOpts are make bench's end-to-end latency runs: the rates offered and
// the runs at each.
type e2eOpts struct {
	rates []int
	runs  int
}

// benchEndToEnd measures end-to-end latency (`ferrybench latency`, its
// default settings) at each rate of o, and returns make bench's section:
// a row per rate, then the whole breakdown at the last rate.
func benchEndToEnd(ctx context.Context, e *env, o e2eOpts) (string, error) {
	if len(o.rates) == 0 {
		return "", nil
	}
	bin, err := e.build("github.com/ferryhq/ferry/cmd/relay", "relay")
	if err != nil {
		return "", err
	}
	lo := latencyFlags(flag.NewFlagSet("latency", flag.ContinueOnError)) // its defaults
	lo.runs = o.runs
	var b strings.Builder
	fmt.Fprintf(&b, "\n## End to end: commit to a consumer's fetch and to a worker's effect\n\n"+
		"An application's commit returned (%d writers, one event per transaction, at a steady offered rate) to a plain franz-go consumer's fetch of the record, "+
		"and to a Ferry worker (`inbox.Worker`, its defaults) committing the effect of a handler that inserts one row; the relay is a real process; "+
		"everything shares this machine's %d cores (`go run ./internal/ferrybench latency -rate N`). %d runs at each rate, each on a new database, slot, topic and relay; "+
		"%s measured after %s of warm-up.\n\n", lo.writers, runtime.NumCPU(), o.runs, lo.duration, lo.warmup)
	fmt.Fprintf(&b, "| offered events/s | commit → fetch p50 / p99 (ms) | commit → effect p50 / p99 (ms) | the machine busy | relay CPU, share of a core | every process's time without a core, s per s |\n|---|---|---|---|---|---|\n")
	var last []*latencyResult
	for _, rate := range o.rates {
		lo.rate = rate
		rs, err := latencyRuns(ctx, e, bin, lo)
		if err != nil {
			return "", err
		}
		quant := func(stage string, q float64) string {
			return spreadOf(rs, func(r *latencyResult) float64 { return r.q(stage, q) * 1000 }, "%.1f")
		}
		fmt.Fprintf(&b, "| %d | %s / **%s** | %s / **%s** | %s%% | %s%% | %s |\n", rate,
			quant(stageCommitFetch, .5), quant(stageCommitFetch, .99), quant(stageCommitEffect, .5), quant(stageCommitEffect, .99),
			spreadOf(rs, func(r *latencyResult) float64 { return r.box * 100 }, "%.0f"),
			spreadOf(rs, func(r *latencyResult) float64 { return r.core("relay").cpu * 100 }, "%.0f"),
			spreadOf(rs, func(r *latencyResult) float64 {
				var w float64
				for _, u := range r.cores {
					w += u.wait
				}
				return w
			}, "%.2f"))
		last = rs
	}
	fmt.Fprintf(&b, "\nTargets: p99 commit → fetch at most 15 ms and commit → effect at most 25 ms at 1,000 events/s. "+
		"Where the time goes at %d events/s, stage by stage and process by process (\"time without a core\": runnable, in the kernel's run queue, summed over a process's threads, from `/proc/PID/task/TID/schedstat`):\n\n", lo.rate)
	lo.label = "Breakdown"
	b.WriteString(strings.Replace(latencyMarkdown(lo, last), "### ", "#### ", 1))
	return b.String(), nil
}

// The per-event stages, from the timestamps each event collects.
const (
	stageCommitAppend   = "commit returned → Kafka append (LogAppendTime, 1 ms resolution)"
	stageAppendFetch    = "Kafka append → plain consumer's fetch"
	stageCommitFetch    = "**commit returned → plain consumer's fetch**"
	stageAppendWorker   = "Kafka append → worker's fetch"
	stageWorkerHandler  = "worker's fetch → handler called (queued in its lane)"
	stageHandlerEffect  = "handler called → effect committed (the transaction, its fsync)"
	stageWorkerEffect   = "worker's fetch → effect committed (all of the worker)"
	stageCommitEffect   = "**commit returned → worker's effect committed**"
	relayCommitReceive  = "ferry_relay_commit_to_receive_seconds"
	relayReceiveAck     = "ferry_relay_receive_to_ack_seconds"
	relayCommitAck      = "ferry_relay_commit_to_ack_seconds"
	latencyEffectsTable = `CREATE TABLE bench_effect (id text PRIMARY KEY)`
)

var stageOrder = []string{stageCommitAppend, stageAppendFetch, stageCommitFetch, stageAppendWorker, stageWorkerHandler, stageHandlerEffect, stageWorkerEffect, stageCommitEffect}

// stamps are one event's timestamps.
type stamps struct {
	measured bool // written in the measured phase
	commit   time.Time
	appended time.Time // the broker's LogAppendTime
	fetched  time.Time // by the plain consumer
	received time.Time // by the worker (Message.ReceivedAt)
	handled  time.Time // the handler was called
	effect   time.Time // the worker's transaction committed
}

type stampBook struct {
	mu sync.Mutex
	m  map[string]*stamps
}

func (b *stampBook) with(id string, f func(*stamps)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.m[id]
	if !ok {
		s = &stamps{}
		b.m[id] = s
	}
	f(s)
}

// timedDB is the worker's DB: its transactions note when their commit
// returned for the messages their handler saw.
type timedDB struct {
	pool *pgxpool.Pool
	book *stampBook
}

func (d timedDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &timedTx{Tx: tx, book: d.book}, nil
}

type timedTx struct {
	pgx.Tx
	book *stampBook
	ids  []string
}

func (t *timedTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	if err == nil {
		now := time.Now()
		for _, id := range t.ids {
			t.book.with(id, func(s *stamps) { s.effect = now })
		}
	}
	return err
}

// latencyResult is one run: every stage's sorted samples (seconds), the
// relay's own histograms over the measured phase, and what the tail events
// spent in each stage.
type latencyResult struct {
	achieved       float64
	events, missed int
	stages         map[string][]float64
	relay          map[string]histogram
	relayCPU       float64 // CPU seconds of the relay process in the measured phase
	relayGC        float64 // GC cycles of the relay in the measured phase
	// Per event of the measured phase: the relay's thread switches, and
	// its wake-up counters (reads of the replication socket, WAL
	// messages, status updates, produce requests).
	relaySwitches, relayReads, relayWAL, relayUpdates, relayProduces float64
	schedP99                                                         float64 // the bench process's goroutine scheduling latency p99
	tailFetch                                                        map[string]float64
	tailEffect                                                       map[string]float64
	tailWindows                                                      [2]int    // distinct 100 ms windows holding the fetch and effect tails
	cores                                                            []coreUse // how the processes shared the cores in the measured phase
	box                                                              float64   // the machine's share busy meanwhile
}

// core is the use of the process group named name (zero if none is).
func (r *latencyResult) core(name string) coreUse {
	for _, u := range r.cores {
		if u.name == name {
			return u
		}
	}
	return coreUse{}
}

func (r *latencyResult) q(stage string, q float64) float64 {
	xs := r.stages[stage]
	if len(xs) == 0 {
		return 0
	}
	return xs[min(int(q*float64(len(xs))), len(xs)-1)]
}

func latencyRun(ctx context.Context, e *env, relayBin string, o *latencyOpts) (*latencyResult, error) {
	url, drop, err := ferrytest.MainDB("bench_latency")
	if err != nil {
		return nil, err
	}
	defer drop()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(o.writers + max(o.workerConcurrency, inbox.ConcurrencyDefault) + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, latencyEffectsTable); err != nil {
		return nil, err
	}
	kcl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		return nil, err
	}
	defer kcl.Close()
	suffix := ferrytest.Suffix()
	topic := "bench.latency." + suffix
	appendTime := "LogAppendTime"
	if _, err := kadm.NewClient(kcl).CreateTopic(ctx, int32(o.partitions), 1, map[string]*string{"message.timestamp.type": &appendTime}, topic); err != nil {
		return nil, err
	}
	defer func() { _, _ = kadm.NewClient(kcl).DeleteTopics(context.Background(), topic) }()

	slot := "bench_latency_" + suffix
	re := *e
	re.environ = append(slices.Clone(e.environ), strings.Fields(o.relayEnv)...)
	p, err := startRelay(&re, relayBin, url, slot, topic, strings.Fields(o.relayArgs)...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.stop() }()

	book := &stampBook{m: map[string]*stamps{}}
	runCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopAll()

	// (a) A plain consumer, no group, from the topic's start.
	cons, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(o.fetchMaxWait))
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	consErr := make(chan error, 1)
	bg.Go(func() {
		for runCtx.Err() == nil {
			fs := cons.PollFetches(runCtx)
			now := time.Now()
			var bad error
			fs.EachRecord(func(r *kgo.Record) {
				if r.Attrs.TimestampType() != 1 {
					bad = errors.New("the topic's records do not carry LogAppendTime")
				}
				book.with(recordID(r), func(s *stamps) { s.fetched, s.appended = now, r.Timestamp })
			})
			if bad != nil {
				consErr <- bad
				return
			}
		}
	})

	// (b) A worker whose handler writes one row.
	kopts := []kgo.Opt{kgo.SeedBrokers(e.brokers...)}
	if o.workerFetchMaxWait > 0 {
		kopts = append(kopts, kgo.FetchMaxWait(o.workerFetchMaxWait))
	}
	w, err := inbox.New(&inbox.Config{
		DB:          timedDB{pool: pool, book: book},
		KafkaOpts:   kopts,
		BatchSize:   o.workerBatch,
		Concurrency: o.workerConcurrency,
	})
	if err != nil {
		return nil, err
	}
	w.Handle("bench_latency_"+suffix, topic, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		now := time.Now()
		if _, err := tx.Exec(ctx, `INSERT INTO bench_effect (id) VALUES ($1)`, m.ID); err != nil {
			return err
		}
		if t, ok := tx.(*timedTx); ok {
			t.ids = append(t.ids, m.ID)
		}
		book.with(m.ID, func(s *stamps) { s.received, s.handled = m.ReceivedAt, now })
		return nil
	})
	workerErr := make(chan error, 1)
	bg.Go(func() { workerErr <- w.Run(runCtx) })

	if err := waitSlotActive(ctx, pool, slot, p); err != nil {
		return nil, err
	}
	if _, _, err := offer(ctx, pool, book, o, o.warmup, false); err != nil {
		return nil, err
	}
	before, err := scrapeRelay(p.metrics)
	if err != nil {
		return nil, err
	}
	sched0 := schedLatencies()
	var walsender int
	if err := pool.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&walsender); err != nil {
		return nil, err
	}
	cores := markCores([]procGroup{
		{"relay", []int{p.cmd.Process.Pid}},
		{"its walsender", []int{walsender}},
		{"Kafka broker", []int{ferrytest.KafkaBrokerPID()}},
		{"PostgreSQL's other processes (the writers' and the worker's backends, WAL writer, checkpointer, ...)", postgresPids(walsender)},
		{fmt.Sprintf("this bench process (%d writers, the plain consumer, the worker)", o.writers), []int{os.Getpid()}},
	})
	switches0, err := procs.ContextSwitches(p.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	sent, achieved, err := offer(ctx, pool, book, o, o.duration, true)
	if err != nil {
		return nil, err
	}
	use, box := cores.since()
	switches1, err := procs.ContextSwitches(p.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	// Everything measured arrives, or 30s pass.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if pending(book) == 0 {
			break
		}
		select {
		case err := <-consErr:
			return nil, err
		case err := <-workerErr:
			return nil, fmt.Errorf("worker stopped: %v", err)
		default:
		}
	}
	after, err := scrapeRelay(p.metrics)
	if err != nil {
		return nil, err
	}
	r := analyse(book)
	r.achieved = achieved
	r.missed = sent - r.events
	r.relay = map[string]histogram{}
	for _, name := range []string{relayCommitReceive, relayReceiveAck, relayCommitAck} {
		r.relay[name] = after.hists[name].minus(before.hists[name])
	}
	r.relayCPU = after.counters["process_cpu_seconds_total"] - before.counters["process_cpu_seconds_total"]
	r.relayGC = after.counters["go_gc_duration_seconds_count"] - before.counters["go_gc_duration_seconds_count"]
	perSent := func(name string) float64 {
		return (after.counters[name] - before.counters[name]) / float64(max(sent, 1))
	}
	r.relaySwitches = (switches1 - switches0) / float64(max(sent, 1))
	r.relayReads, r.relayWAL = perSent("ferry_relay_replication_reads_total"), perSent(`ferry_relay_replication_messages_total{kind="wal"}`)
	r.relayUpdates, r.relayProduces = perSent("ferry_relay_status_updates_total"), perSent("ferry_relay_kafka_produce_requests_total")
	r.schedP99 = histQuantile(schedLatencies(), sched0, .99)
	r.cores, r.box = use, box
	return r, nil
}

func recordID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == outbox.HeaderID {
			return string(h.Value)
		}
	}
	return ""
}

func waitSlotActive(ctx context.Context, pool *pgxpool.Pool, slot string, p *relayProc) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		var active bool
		err := pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if err == nil && active {
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		select {
		case err := <-p.done:
			return fmt.Errorf("relay exited: %v (log %s)", err, p.logFile)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("slot %s not active after 30s (relay log %s)", slot, p.logFile)
}

// offer commits one event per transaction at o.rate for d, open loop: a
// pacer releases event i at start + i/rate to o.writers connections. It
// returns the events committed and the rate achieved.
func offer(ctx context.Context, pool *pgxpool.Pool, book *stampBook, o *latencyOpts, d time.Duration, measured bool) (int, float64, error) {
	total := int(d.Seconds() * float64(o.rate))
	jobs := make(chan int, o.rate)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	payload := make([]byte, o.payload)
	for range o.writers {
		wg.Go(func() {
			for i := range jobs {
				ids, err := outbox.Write(ctx, pool, outbox.Event{
					AggregateType: "load", AggregateID: "agg-" + strconv.Itoa(i%1000), EventType: "Changed", Payload: payload,
				})
				now := time.Now()
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					continue
				}
				book.with(ids[0].String(), func(s *stamps) { s.commit, s.measured = now, measured })
			}
		})
	}
	start := time.Now()
	interval := time.Second / time.Duration(o.rate)
	for i := range total {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return total, float64(total) / time.Since(start).Seconds(), firstErr
}

// pending counts the measured events not yet fetched by both consumers.
func pending(book *stampBook) int {
	book.mu.Lock()
	defer book.mu.Unlock()
	n := 0
	for _, s := range book.m {
		if s.measured && (s.fetched.IsZero() || s.effect.IsZero()) {
			n++
		}
	}
	return n
}

func analyse(book *stampBook) *latencyResult {
	book.mu.Lock()
	defer book.mu.Unlock()
	r := &latencyResult{stages: map[string][]float64{}}
	var all []*stamps
	for _, s := range book.m {
		if !s.measured || s.fetched.IsZero() || s.effect.IsZero() {
			continue
		}
		all = append(all, s)
	}
	r.events = len(all)
	sec := func(a, b time.Time) float64 { return b.Sub(a).Seconds() }
	stagesOf := func(s *stamps) map[string]float64 {
		return map[string]float64{
			stageCommitAppend:  sec(s.commit, s.appended),
			stageAppendFetch:   sec(s.appended, s.fetched),
			stageCommitFetch:   sec(s.commit, s.fetched),
			stageAppendWorker:  sec(s.appended, s.received),
			stageWorkerHandler: sec(s.received, s.handled),
			stageHandlerEffect: sec(s.handled, s.effect),
			stageWorkerEffect:  sec(s.received, s.effect),
			stageCommitEffect:  sec(s.commit, s.effect),
		}
	}
	for _, s := range all {
		for k, v := range stagesOf(s) {
			r.stages[k] = append(r.stages[k], v)
		}
	}
	for _, xs := range r.stages {
		slices.Sort(xs)
	}
	// The tail: the events at or above the p99 of each end-to-end figure,
	// with the median of what they spent in each stage, and how many
	// distinct 100 ms windows of commit time they fall in (few windows: a
	// stall; many: a steady queue).
	tail := func(end string) (map[string]float64, int) {
		cut := r.q(end, .99)
		per := map[string][]float64{}
		windows := map[int64]bool{}
		for _, s := range all {
			st := stagesOf(s)
			if st[end] < cut {
				continue
			}
			windows[s.commit.UnixMilli()/100] = true
			for k, v := range st {
				per[k] = append(per[k], v)
			}
		}
		out := map[string]float64{}
		for k, xs := range per {
			out[k] = median(xs)
		}
		return out, len(windows)
	}
	r.tailFetch, r.tailWindows[0] = tail(stageCommitFetch)
	r.tailEffect, r.tailWindows[1] = tail(stageCommitEffect)
	return r
}

// relayScrape is what the latency tool reads of the relay's /metrics.
type relayScrape struct {
	hists    map[string]histogram
	counters map[string]float64
}

func scrapeRelay(url string) (relayScrape, error) {
	out := relayScrape{hists: map[string]histogram{}, counters: map[string]float64{}}
	resp, err := http.Get(url)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, ok := strings.Cut(line, "_bucket{le=\"")
		if ok {
			le, count, _ := strings.Cut(rest, `"} `)
			b, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				b, err = 1e9, nil
			}
			c, err2 := strconv.ParseFloat(count, 64)
			if err != nil || err2 != nil {
				return out, fmt.Errorf("parse bucket %q", line)
			}
			h := out.hists[name]
			h.bounds = append(h.bounds, b)
			h.counts = append(h.counts, c)
			out.hists[name] = h
			continue
		}
		if name, v, ok := strings.Cut(line, " "); ok { // a labelled series by its name with the labels
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				out.counters[name] = f
			}
		}
	}
	return out, sc.Err()
}

// schedLatencies reads this process's goroutine scheduling latencies.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// histQuantile is q of the difference of two readings of a runtime
// histogram (the upper bound of the bucket that holds it).
func histQuantile(after, before *metrics.Float64Histogram, q float64) float64 {
	if after == nil || before == nil {
		return 0
	}
	var total uint64
	diff := make([]uint64, len(after.Counts))
	for i := range diff {
		diff[i] = after.Counts[i] - before.Counts[i]
		total += diff[i]
	}
	rank := uint64(q * float64(total))
	var seen uint64
	for i, c := range diff {
		seen += c
		if seen > rank {
			return after.Buckets[i+1]
		}
	}
	return 0
}

func ms(s float64) string { return fmt.Sprintf("%.1f ms", s*1000) }

func latencyMarkdown(o *latencyOpts, rs []*latencyResult) string {
	var b strings.Builder
	med := func(f func(*latencyResult) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	spread := func(f func(*latencyResult) float64) string { // in ms
		return spreadOf(rs, func(r *latencyResult) float64 { return f(r) * 1000 }, "%.1f")
	}
	label := o.label
	if label == "" {
		label = "latency"
	}
	fmt.Fprintf(&b, "### %s: %d events/s for %s, one event per transaction, %d writers, %d partitions, %d-byte payloads; median of %d runs (range)\n\n",
		label, o.rate, o.duration, o.writers, o.partitions, o.payload, len(rs))
	fmt.Fprintf(&b, "| stage (ms) | p50 | p90 | p99 | p99.9 | max | p99 events: median |\n|---|---|---|---|---|---|---|\n")
	for _, st := range stageOrder {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | fetch tail %.1f, effect tail %.1f |\n", st,
			spread(func(r *latencyResult) float64 { return r.q(st, .5) }),
			spread(func(r *latencyResult) float64 { return r.q(st, .9) }),
			spread(func(r *latencyResult) float64 { return r.q(st, .99) }),
			spread(func(r *latencyResult) float64 { return r.q(st, .999) }),
			spread(func(r *latencyResult) float64 { return r.q(st, 1) }),
			med(func(r *latencyResult) float64 { return r.tailFetch[st] })*1000,
			med(func(r *latencyResult) float64 { return r.tailEffect[st] })*1000)
	}
	for _, name := range []string{relayCommitReceive, relayReceiveAck, relayCommitAck} {
		fmt.Fprintf(&b, "| relay histogram `%s` | %s | %s | %s | %s | | |\n", name,
			spread(func(r *latencyResult) float64 { return r.relay[name].quantile(.5) }),
			spread(func(r *latencyResult) float64 { return r.relay[name].quantile(.9) }),
			spread(func(r *latencyResult) float64 { return r.relay[name].quantile(.99) }),
			spread(func(r *latencyResult) float64 { return r.relay[name].quantile(.999) }))
	}
	fmt.Fprintf(&b, "\n| process, over the measured phase | CPU, share of a core | runnable but without a core, ms per second |\n|---|---|---|\n")
	for i, u := range rs[0].cores {
		fmt.Fprintf(&b, "| %s | %s%% | %s |\n", u.name,
			spreadOf(rs, func(r *latencyResult) float64 { return r.cores[i].cpu * 100 }, "%.0f"),
			spreadOf(rs, func(r *latencyResult) float64 { return r.cores[i].wait * 1000 }, "%.0f"))
	}
	fmt.Fprintf(&b, "| the machine, all %d cores | %s%% busy | |\n", runtime.NumCPU(), spreadOf(rs, func(r *latencyResult) float64 { return r.box * 100 }, "%.0f"))
	fmt.Fprintf(&b, "\nOffered %.0f events/s; %.0f events measured per run, %.0f not seen by both consumers. "+
		"The fetch tail falls in %.0f and the effect tail in %.0f distinct 100 ms windows of commit time. "+
		"Relay: %.2f CPU s per 1,000 events, %.0f GC cycles per run. Bench process goroutine scheduling latency p99: %s.\n",
		med(func(r *latencyResult) float64 { return r.achieved }), med(func(r *latencyResult) float64 { return float64(r.events) }),
		med(func(r *latencyResult) float64 { return float64(r.missed) }),
		med(func(r *latencyResult) float64 { return float64(r.tailWindows[0]) }),
		med(func(r *latencyResult) float64 { return float64(r.tailWindows[1]) }),
		med(func(r *latencyResult) float64 { return r.relayCPU / float64(max(r.events, 1)) * 1000 }),
		med(func(r *latencyResult) float64 { return r.relayGC }),
		ms(med(func(r *latencyResult) float64 { return r.schedP99 })))
	fmt.Fprintf(&b, "Relay, per event: %s thread switches (`/proc/PID/task/*/status`), %s reads of the replication socket bringing %s WAL messages, %s status updates, %s Kafka produce requests.\n",
		spreadOf(rs, func(r *latencyResult) float64 { return r.relaySwitches }, "%.2f"),
		spreadOf(rs, func(r *latencyResult) float64 { return r.relayReads }, "%.2f"),
		spreadOf(rs, func(r *latencyResult) float64 { return r.relayWAL }, "%.2f"),
		spreadOf(rs, func(r *latencyResult) float64 { return r.relayUpdates }, "%.3f"),
		spreadOf(rs, func(r *latencyResult) float64 { return r.relayProduces }, "%.2f"))
	return b.String()
}

// spreadOf is the median (min-max) over the runs of f, each formatted
// with verb.
func spreadOf(rs []*latencyResult, f func(*latencyResult) float64, verb string) string {
	xs := make(samples, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return xs.Format(verb)
}

// runLatency is `ferrybench latency`.
func runLatency(ctx context.Context, fs *flag.FlagSet, args []string) error {
	o := latencyFlags(fs)
	_ = fs.Parse(args)
	return benchLatency(ctx, o, os.Stdout)
}
