// Command ferrybench measures Ferry against ceilings taken in the same run
// on the same machine, and prints markdown tables.
//
//	eval "$(scripts/stack up)"
//	go run ./internal/ferrybench relay  [-events 1000000] [-runs 3]
//	go run ./internal/ferrybench worker [-one-per-tx 20000] [-batched 200000] [-worker-runs 3]
//	go run ./internal/ferrybench writer [-events 200000]
//	go run ./internal/ferrybench latency [-rate 1000] [-runs 3]   (end to end; see latency.go)
//	go run ./internal/ferrybench curves [-curves-scale 1] [-charts docs/bench]   (how cost grows; see curves.go)
//	go run ./internal/ferrybench rabbitmq [-rabbitmq-events 100000] [-rabbitmq-runs 3]   (the relay and the worker on RabbitMQ; see rabbitmq.go)
//	go run ./internal/ferrybench retention [-rows 10000000]   (expiring rows: batched DELETE against partitions; see retention.go)
//	go run ./internal/ferrybench all    [-out docs/benchmarks.md]   (what make bench runs)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/relay"
)

const usage = `usage: ferrybench relay|worker|writer|latency|curves|rabbitmq|retention|shapes|migration|all [flags]   (ferrybench <command> -h for the flags)`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var ro relayOpts
	relayFlags := func() {
		fs.IntVar(&ro.events, "events", 1_000_000, "backlog size drained by the relay")
		fs.IntVar(&ro.runs, "runs", 3, "measurements of each relay figure; the median is reported")
		fs.IntVar(&ro.rate, "rate", 1000, "events per second offered in the latency phase")
		fs.DurationVar(&ro.latencyFor, "latency-duration", 15*time.Second, "length of the latency phase")
		fs.IntVar(&ro.payload, "payload", 200, "payload bytes per event")
	}
	var wo workerOpts
	workerFlags := func() {
		fs.IntVar(&wo.onePerTx, "one-per-tx", 20_000, "messages of the one-per-transaction worker run")
		fs.IntVar(&wo.batched, "batched", 200_000, "messages of the batched worker run")
		fs.IntVar(&wo.batch, "batch", 100, "messages per transaction of the batched run")
		fs.IntVar(&wo.runs, "worker-runs", 3, "samples of the worker and of its SQL-only ceiling, taken in turn; the median and range are reported")
	}
	var writerEvents int
	writerFlags := func() {
		fs.IntVar(&writerEvents, "writer-events", 200_000, "events written through outbox.Write in 100-event transactions (a tenth of them one per transaction)")
	}
	var co curveOpts
	curveFlags := func() {
		fs.Float64Var(&co.scale, "curves-scale", 1, "multiplies the event and message counts of every point of the curves (how cost grows)")
	}
	rabbit := rabbitOpts{shards: rabbitmq.ShardsDefault, channels: relay.RabbitMQChannelsDefault, batch: 100, payload: 200}
	rabbitFlags := func() {
		fs.IntVar(&rabbit.events, "rabbitmq-events", 100_000, "backlog drained into RabbitMQ by the relay and sent by the bare publisher, every round")
		fs.IntVar(&rabbit.runs, "rabbitmq-runs", 3, "rounds of the bare publisher and the relay on RabbitMQ")
		fs.IntVar(&rabbit.onePerTx, "rabbitmq-one-per-tx", 20_000, "messages of the one-per-transaction RabbitMQ worker run")
		fs.IntVar(&rabbit.batched, "rabbitmq-batched", 100_000, "messages of the batched RabbitMQ worker run")
		fs.IntVar(&rabbit.workerRuns, "rabbitmq-worker-runs", 3, "samples of the RabbitMQ worker and of its SQL-only ceiling, taken in turn")
	}
	mo := migrationOpts{batch: 100, payload: 200}
	migrationFlags := func() {
		fs.IntVar(&mo.relayEvents, "migration-events", 300_000, "backlog of each of the relay's drains to one channel and to two")
		fs.IntVar(&mo.onePerTx, "migration-one-per-tx", 20_000, "messages of the one-per-transaction worker samples in OLD_ONLY and DUAL_WRITE")
		fs.IntVar(&mo.batched, "migration-batched", 100_000, "messages of the batched worker samples in OLD_ONLY and DUAL_WRITE")
		fs.IntVar(&mo.runs, "migration-runs", 3, "rounds of each: one channel, then two")
	}
	var err error
	switch os.Args[1] {
	case "relay":
		relayFlags()
		_ = fs.Parse(os.Args[2:])
		err = benchRelay(ctx, ro, os.Stdout)
	case "worker":
		workerFlags()
		_ = fs.Parse(os.Args[2:])
		err = withEnv(func(e *env) error {
			rs, err := benchWorkers(ctx, e, wo)
			if err == nil {
				fmt.Print(workerMarkdown(rs))
			}
			return err
		})
	case "writer":
		writerFlags()
		ro.payload = 200
		_ = fs.Parse(os.Args[2:])
		err = withEnv(func(e *env) error {
			ws, err := benchWriters(ctx, writerEvents, ro.payload)
			if err == nil {
				fmt.Print(writerMarkdown(ws, 0))
			}
			return err
		})
	case "latency":
		err = runLatency(ctx, fs, os.Args[2:])
	case "curves":
		curveFlags()
		fs.StringVar(&co.charts, "charts", "", "write the SVG charts into this directory; the markdown links to them there")
		only := fs.String("only", "", "run only these curves, by chart name: relay-payload,worker-batch-size,...")
		_ = fs.Parse(os.Args[2:])
		if *only != "" {
			co.only = strings.Split(*only, ",")
		}
		co.link = filepath.ToSlash(co.charts)
		err = withEnv(func(e *env) error {
			md, err := benchCurves(ctx, e, co)
			if err == nil {
				fmt.Print(md)
			}
			return err
		})
	case "rabbitmq":
		rabbitFlags()
		fs.IntVar(&rabbit.payload, "payload", 200, "payload bytes per event")
		fs.IntVar(&rabbit.batch, "batch", 100, "messages per transaction of the batched worker run")
		_ = fs.Parse(os.Args[2:])
		err = withEnv(func(e *env) error {
			r, err := benchRabbitMQ(ctx, e, rabbit)
			if err == nil {
				fmt.Print(r.markdown())
			}
			return err
		})
	case "retention":
		err = runRetention(ctx, fs, os.Args[2:])
	case "shapes":
		err = runShapes(ctx, fs, os.Args[2:])
	case "migration":
		migrationFlags()
		fs.IntVar(&mo.payload, "payload", 200, "payload bytes per event")
		fs.IntVar(&mo.batch, "batch", 100, "messages per transaction of the batched worker samples")
		relayArgs := fs.String("relay-args", "", "extra arguments of the relay's run command, space-separated")
		_ = fs.Parse(os.Args[2:])
		mo.relayArgs = strings.Fields(*relayArgs)
		err = withEnv(func(e *env) error {
			r, err := benchMigration(ctx, e, mo)
			if err == nil {
				fmt.Print(r.markdown())
			}
			return err
		})
	case "all":
		relayFlags()
		workerFlags()
		writerFlags()
		curveFlags()
		rabbitFlags()
		migrationFlags()
		var so shapesOpts
		shapesParsed := shapesFlags(fs, &so, "shapes-")
		withShapes := fs.Bool("shapes", true, "drain backlogs of 1 to 1,000 events per transaction against the walsender's own bound (a few minutes)")
		withRabbit := fs.Bool("rabbitmq", true, "measure the relay and the worker on RabbitMQ next to their ceilings (about three minutes)")
		curves := fs.Bool("curves", true, "measure how cost grows (a few minutes; charts into bench/ beside -out)")
		e2eRates := fs.String("e2e-rates", "250,500,1000", "offered rates (events/s) of the end-to-end latency runs, with a Ferry worker; empty skips them")
		e2eRuns := fs.Int("e2e-runs", 3, "end-to-end latency runs at each rate")
		out := fs.String("out", "", "also write the report to this file (make bench: docs/benchmarks.md)")
		_ = fs.Parse(os.Args[2:])
		var cop *curveOpts
		if *curves {
			if *out != "" {
				co.charts, co.link = filepath.Join(filepath.Dir(*out), "bench"), "bench"
			}
			cop = &co
		}
		var rates []int
		for _, f := range strings.Split(*e2eRates, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			r, perr := strconv.Atoi(f)
			if perr != nil || r <= 0 {
				err = fmt.Errorf("-e2e-rates: %q is not a positive number of events per second", f)
				break
			}
			rates = append(rates, r)
		}
		var rop *rabbitOpts
		if *withRabbit {
			rabbit.payload, rabbit.batch = ro.payload, wo.batch
			rop = &rabbit
		}
		mo.payload, mo.batch = ro.payload, wo.batch
		var sop *shapesOpts
		if *withShapes && err == nil {
			err = shapesParsed()
			sop = &so
		}
		if err == nil {
			err = withEnv(func(e *env) error {
				return benchAll(ctx, e, ro, wo, writerEvents, cop, rop, mo, sop, e2eOpts{rates, *e2eRuns}, *out)
			})
		}
	default:
		err = fmt.Errorf("unknown benchmark %q\n%s", os.Args[1], usage)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferrybench:", err)
		os.Exit(1)
	}
}

func withEnv(f func(*env) error) error {
	e, err := stackEnv()
	if err != nil {
		return err
	}
	if os.Getenv("FERRYBENCH_KEEP") == "" { // set: keep the relays' logs, and say where
		defer os.RemoveAll(e.dir)
	} else {
		log("keeping the scratch directory %s", e.dir)
	}
	return f(e)
}

// benchWriters measures outbox.Write in 100-event transactions from 8
// clients and in single-event transactions from 16 clients (a tenth as many
// events: they are fsync-bound).
func benchWriters(ctx context.Context, events, payload int) ([]writerResult, error) {
	url, drop, err := ferrytest.MainDB("bench_writer")
	if err != nil {
		return nil, err
	}
	defer drop()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var out []writerResult
	for _, c := range []struct{ clients, perTx, events int }{{8, 100, events}, {16, 1, max(events/10, 1)}} {
		r, err := benchWriter(ctx, pool, c.clients, c.perTx, c.events, payload)
		if err != nil {
			return nil, err
		}
		log("writer %d clients x %d events per tx: %.0f events/s", c.clients, c.perTx, r.rate)
		out = append(out, r)
	}
	return out, nil
}

func writerMarkdown(ws []writerResult, drain float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| writer: `outbox.Write` of the relay benchmark's events in the caller's transaction | events/s | relay drain / this |\n|---|---|---|\n")
	for _, w := range ws {
		ratio := ""
		if drain > 0 {
			ratio = fmt.Sprintf("**%.2f**", drain/w.rate)
		}
		what := fmt.Sprintf("%d events per transaction", w.perTx)
		if w.perTx == 1 {
			what = "one event per transaction"
		}
		fmt.Fprintf(&b, "| %s, %d clients, %d events | %.0f | %s |\n", what, w.clients, w.events, w.rate, ratio)
	}
	return b.String()
}

// benchAll runs every benchmark and writes the report; co nil skips the
// curves, rbo nil RabbitMQ.
func benchAll(ctx context.Context, e *env, ro relayOpts, wo workerOpts, writerEvents int, co *curveOpts, rbo *rabbitOpts, mo migrationOpts, so *shapesOpts, eo e2eOpts, out string) error {
	pool, err := pgxpool.New(ctx, e.admin)
	if err != nil {
		return err
	}
	m := describeMachine(ctx, pool)
	pool.Close()
	started := time.Now()
	ws, err := benchWriters(ctx, writerEvents, ro.payload)
	if err != nil {
		return err
	}
	rr, err := runRelay(ctx, e, ro)
	if err != nil {
		return err
	}
	wr, err := benchWorkers(ctx, e, wo)
	if err != nil {
		return err
	}
	var shapesMD string
	if so != nil {
		md, err := benchShapes(ctx, e, *so)
		if err != nil {
			return fmt.Errorf("shapes: %w", err)
		}
		shapesMD = "\n## Drain by transaction shape\n\nThe relay's drain of backlogs written one to 1,000 events per transaction (`go run ./internal/ferrybench shapes`), against the walsender's own bound in each drain.\n\n" + md
	}
	var rabbitMD string
	if rbo != nil {
		rr, err := benchRabbitMQ(ctx, e, *rbo)
		if err != nil {
			return err
		}
		rabbitMD = rr.markdown()
	}
	mr, err := benchMigration(ctx, e, mo)
	if err != nil {
		return err
	}
	e2e, err := benchEndToEnd(ctx, e, eo)
	if err != nil {
		return err
	}
	var curves string
	if co != nil {
		if curves, err = benchCurves(ctx, e, *co); err != nil {
			return err
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\n")
	fmt.Fprintf(&b, "Written by `make bench` (`go run ./internal/ferrybench all -out docs/benchmarks.md`) on %s, in %s.\n",
		started.UTC().Format("2006-01-02 15:04 UTC"), time.Since(started).Round(time.Second))
	fmt.Fprintf(&b, "Every ceiling was measured in the same run, on the same machine, against the same PostgreSQL, Kafka and RabbitMQ\n"+
		"(the no-Docker stack of `scripts/stack`: fsync on, one broker, one RabbitMQ node). Quote the ratios: the absolute figures\n"+
		"belong to this machine, and to whatever else ran on it at the time.\n\n")
	b.WriteString(m.markdown())
	fmt.Fprintf(&b, "\n## Writing events\n\nWhat applications can commit; the relay keeps up with them when its drain rate is above it (ratio > 1).\n\n")
	b.WriteString(writerMarkdown(ws, rr.drain.Median()))
	fmt.Fprintf(&b, "\n## Relay\n\nThe relay drains a backlog written before it starts (a real `relay run` process), next to the ceilings it sits between:\n"+
		"the walsender streaming the same WAL with the same options to PostgreSQL's own client, `pg_recvlogical`, writing to `/dev/null` (the path the relay reads, with nothing downstream),\n"+
		"sampled in turn with the relay; and, as second lines, PostgreSQL decoding the same WAL server-side (peek) and franz-go producing the same records with nothing upstream.\n\n")
	b.WriteString(rr.markdown())
	b.WriteString(shapesMD)
	fmt.Fprintf(&b, "\n## Worker\n\nThe worker (in-process `inbox.Worker`) from Kafka to committed inbox row plus effect, next to the same SQL statements\n"+
		"sent straight to PostgreSQL by as many clients as the worker's concurrency, sampled in turn with the worker from the same table state.\n\n")
	b.WriteString(workerMarkdown(wr))
	b.WriteString(rabbitMD)
	b.WriteString(mr.markdown())
	b.WriteString(e2e)
	b.WriteString(curves)
	fmt.Fprint(os.Stdout, b.String())
	if out == "" {
		return nil
	}
	return writeReport(out, b.String())
}

// The peers' sections of docs/benchmarks.md, written by `make bench-peers`
// (on Kafka, then on RabbitMQ), lie between these lines; `make bench`
// carries them over untouched.
const (
	peersBegin       = "<!-- bench-peers:begin -->"
	peersEnd         = "<!-- bench-peers:end -->"
	rabbitPeersBegin = "<!-- bench-peers-rabbitmq:begin -->"
	rabbitPeersEnd   = "<!-- bench-peers-rabbitmq:end -->"
)

// writeReport writes report to path, followed by the peers' sections of
// the file it replaces, if that had them, byte for byte.
func writeReport(path, report string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, m := range [][2]string{{peersBegin, peersEnd}, {rabbitPeersBegin, rabbitPeersEnd}} {
		if peers, ok := section(string(old), m[0], m[1]); ok {
			report += "\n" + peers + "\n"
		}
	}
	return os.WriteFile(path, []byte(report), 0o644)
}

// section returns the text from the begin marker to the end marker, both
// included.
func section(doc, begin, end string) (string, bool) {
	i := strings.Index(doc, begin)
	if i < 0 {
		return "", false
	}
	j := strings.Index(doc[i:], end)
	if j < 0 {
		return "", false
	}
	return doc[i : i+j+len(end)], true
}
