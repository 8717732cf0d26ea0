package faults

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
)

const usage = `ferryfaults: Ferry's fault-injection suite.

Usage:
  ferryfaults run [-soak] [-control] [-broker rabbitmq] [flags]
                                               the suite against the stack in FERRY_STACK_DIR
  ferryfaults control [flags]                  only the negative controls
  ferryfaults worker -topic T -consumers A,B [-name N] run [worker run flags]
                                               the checker worker (workercli with the effect handler)
  ferryfaults load [flags]                     the load generator

run and control stop the stack's broker and restart its PostgreSQL: give them
a stack of their own (scripts/faults does), e.g.
  FERRY_STACK_DIR=/tmp/ferry-stack-faults scripts/stack up
  FERRY_STACK_DIR=/tmp/ferry-stack-faults go run ./internal/faults/cmd/ferryfaults run
`

// Main is the ferryfaults command line; it returns the exit code: 0 when
// the suite passed and the negative control was caught, 1 otherwise, 2 on a
// usage error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run", "control":
		return mainRun(ctx, args[0], args[1:], stdout, stderr)
	case "worker":
		return mainWorker(ctx, args[1:], stdout, stderr)
	case "load":
		return mainLoad(ctx, args[1:], stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "ferryfaults: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func mainRun(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ferryfaults "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	broker := fs.String("broker", BrokerKafka, "the channel: kafka, or rabbitmq (the stack's RabbitMQ node; faults "+joinKinds(RabbitMQFaults)+")")
	soak := fs.Bool("soak", false, "the long run: 1,000,000 events over 20 minutes, faults in rounds")
	control := fs.Bool("control", cmd == "control", "also run the negative controls (the unsafe relay, then the unsafe worker)")
	events := fs.Int("events", 0, "events to commit (default: 24000, or 1000000 with -soak)")
	duration := fs.Duration("duration", 0, "spread the events over this long (default 60s, or 20m with -soak)")
	seed := fs.Uint64("seed", 0, "seed of the fault schedule and the load (default: from the clock)")
	keep := fs.Bool("keep", false, "keep the databases, topics and logs of the runs (a failed run keeps them anyway)")
	report := fs.String("report", "", "also write the markdown report to this file")
	kinds := fs.String("faults", "", "comma-separated fault kinds to inject (default all: "+joinKinds(AllFaults)+"; on RabbitMQ those of -broker)")
	workDir := fs.String("workdir", "", "directory for binaries and logs (default: a new temporary directory)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	valid := AllFaults
	o := Short()
	switch {
	case *broker == BrokerRabbitMQ:
		valid = RabbitMQFaults
		if *soak {
			o = Soak()
			o.Broker, o.Kinds = BrokerRabbitMQ, nil
		} else {
			o = RabbitMQShort()
			o.Kinds = nil
		}
	case *broker != BrokerKafka:
		fmt.Fprintf(stderr, "ferryfaults: -broker %q: want %s or %s\n", *broker, BrokerKafka, BrokerRabbitMQ)
		return 2
	case *soak:
		o = Soak()
	}
	if *events > 0 {
		o.Events = *events
	}
	if *duration > 0 {
		o.LoadDuration = *duration
	}
	o.Seed, o.Keep, o.Log = *seed, *keep, stderr
	if *kinds != "" {
		for _, k := range strings.Split(*kinds, ",") {
			if !slices.Contains(valid, FaultKind(k)) {
				fmt.Fprintf(stderr, "ferryfaults: unknown fault kind %q\n", k)
				return 2
			}
			o.Kinds = append(o.Kinds, FaultKind(k))
		}
	}
	dir := *workDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "ferryfaults"); err != nil {
			fmt.Fprintln(stderr, "ferryfaults:", err)
			return 1
		}
	}
	ok := true
	defer func() {
		// A temporary directory goes when everything passed; logs of a
		// failure, or of a run asked to keep them, stay.
		if ok && !*keep && *workDir == "" {
			_ = os.RemoveAll(dir)
			return
		}
		fmt.Fprintf(stderr, "ferryfaults: logs in %s\n", dir)
	}()
	o.WorkDir = dir
	fmt.Fprintf(stderr, "ferryfaults: building the relay and ferryfaults into %s\n", dir)
	bins, err := BuildBinaries(ctx, dir)
	if err != nil {
		fmt.Fprintln(stderr, "ferryfaults:", err)
		return 1
	}
	o.Bins = bins

	var out strings.Builder
	if cmd == "run" {
		rep, err := Run(ctx, o)
		if err != nil {
			fmt.Fprintln(stderr, "ferryfaults: suite:", err)
			ok = false
			return 1
		}
		out.WriteString(rep.Markdown())
		ok = rep.OK()
	}
	if *control {
		type control struct {
			run   func(context.Context, Options) (*Report, error)
			order bool // caught by order inversions, not by loss
		}
		controls := []control{
			{run: func(ctx context.Context, o Options) (*Report, error) { return RunControl(ctx, ControlOptions(o)) }},
			{run: func(ctx context.Context, o Options) (*Report, error) {
				return RunWorkerControl(ctx, WorkerControlOptions(o))
			}},
		}
		if o.rabbit() {
			controls = []control{
				{run: func(ctx context.Context, o Options) (*Report, error) {
					return RunControl(ctx, RabbitMQControlOptions(o))
				}},
				{run: func(ctx context.Context, o Options) (*Report, error) {
					return RunWorkerControl(ctx, RabbitMQWorkerControlOptions(o))
				}},
				{run: func(ctx context.Context, o Options) (*Report, error) {
					return RunNoMandatoryControl(ctx, RabbitMQControlOptions(o))
				}},
				{run: func(ctx context.Context, o Options) (*Report, error) {
					return RunRequeueControl(ctx, RequeueControlOptions(o))
				}, order: true},
			}
		}
		for _, c := range controls {
			rep, err := c.run(ctx, o)
			if err != nil {
				fmt.Fprintln(stderr, "ferryfaults: negative control:", err)
				ok = false
				return 1
			}
			out.WriteString("\n" + rep.Markdown())
			if c.order {
				if err := rep.OrderControlCaught(); err != nil {
					fmt.Fprintf(&out, "\n**The negative control was not caught: %v. It proves nothing.**\n", err)
					ok = false
				} else {
					fmt.Fprintf(&out, "\nThe checker caught the negative control: %d order inversions over %d consumers.\n", rep.Inversions(), len(rep.Consumers))
				}
				continue
			}
			if err := rep.ControlCaught(); err != nil {
				fmt.Fprintf(&out, "\n**The negative control was not caught: %v. It proves nothing.**\n", err)
				ok = false
			} else {
				fmt.Fprintf(&out, "\nThe checker caught the negative control: %d lost effects over %d consumers.\n", rep.Lost(), len(rep.Consumers))
			}
		}
	}
	fmt.Fprint(stdout, out.String())
	if *report != "" {
		doc := fmt.Sprintf("# Fault-injection run\n\nWritten by `ferryfaults %s %s` on %s.\n\n%s", cmd, strings.Join(args, " "),
			time.Now().UTC().Format("2006-01-02 15:04 UTC"), out.String())
		if err := os.WriteFile(*report, []byte(doc), 0o644); err != nil {
			fmt.Fprintln(stderr, "ferryfaults:", err)
			ok = false
			return 1
		}
	}
	if !ok {
		return 1
	}
	return 0
}

// WorkerControlOptions derives the worker's negative control's options: a
// short load, one worker whose effects take 20 ms each, so that its batches
// are always in flight when it is killed.
func WorkerControlOptions(o Options) Options {
	c := ControlOptions(o)
	c.Events, c.LoadDuration = 3000, 10*time.Second
	c.Warmup = 6 * time.Second
	c.EffectDelay = 20 * time.Millisecond
	return c
}

// ControlOptions derives the negative control's options from a run's: a
// short load, one worker, a broker outage of KafkaOutage[0] during which the
// unsafe relay is killed.
func ControlOptions(o Options) Options {
	c := o
	c.Events, c.LoadDuration = 6000, 20*time.Second
	c.Workers = 1
	c.WorkerArgs = func(int) []string { return []string{"--batch-size", "50"} }
	c.Warmup = 4 * time.Second
	c.KafkaOutage = [2]time.Duration{5 * time.Second, 5 * time.Second}
	c.DrainTimeout = 2 * time.Minute
	return c
}

func mainWorker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ferryfaults worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "worker", "name recorded in each effect row")
	topic := fs.String("topic", "", "topic to consume")
	consumers := fs.String("consumers", "", "comma-separated consumer names, each applying every message")
	delay := fs.Duration("effect-delay", 0, "sleep in each effect's transaction (negative control only)")
	failEvery := fs.Int("fail-every", 0, "fail the first attempt of about one versioned message in this many, transiently (the requeue control); 0: never, at most 255")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *topic == "" || *consumers == "" {
		fmt.Fprintln(stderr, "ferryfaults worker: -topic and -consumers are required")
		return 2
	}
	e := &Effects{Worker: *name, Delay: *delay, FailEvery: *failEvery}
	return workercli.Main(ctx, fs.Args(), stdout, stderr, &workercli.App{Name: "ferryfaults worker", Register: e.Register(*topic, strings.Split(*consumers, ",")...)})
}

func mainLoad(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("ferryfaults load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o LoadOptions
	fs.StringVar(&o.DatabaseURL, "database-url", os.Getenv("FERRY_DATABASE_URL"), "PostgreSQL URL (env FERRY_DATABASE_URL)")
	fs.IntVar(&o.Events, "events", 20000, "events to commit")
	fs.DurationVar(&o.Duration, "duration", time.Minute, "spread the events over this long")
	fs.IntVar(&o.Aggregates, "aggregates", 1000, "versioned aggregates")
	fs.IntVar(&o.Clients, "clients", 4, "concurrent transactions")
	fs.IntVar(&o.MaxTx, "max-tx", 300, "largest transaction, in events")
	fs.IntVar(&o.PoisonEvery, "poison-every", 0, "add a poison event to every n-th transaction of a client")
	fs.IntVar(&o.HugeEvery, "huge-every", 0, "add an oversized event to every n-th transaction of a client")
	fs.IntVar(&o.HugeBytes, "huge-bytes", 192<<10, "payload bytes of an oversized event")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the transactions")
	fs.StringVar(&o.AbortedFile, "aborted", "", "file of the events of transactions that did not commit (JSON lines)")
	result := fs.String("result", "", "file for the result (JSON); default stdout")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	res, err := RunLoad(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "ferryfaults load:", err)
		return 1
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if *result == "" {
		_, _ = os.Stdout.Write(append(b, '\n'))
		return 0
	}
	if err := os.WriteFile(*result, b, 0o644); err != nil {
		fmt.Fprintln(stderr, "ferryfaults load:", err)
		return 1
	}
	fmt.Fprintf(stderr, "ferryfaults load: %s\n", b)
	return 0
}

func joinKinds(kinds []FaultKind) string {
	all := make([]string, len(kinds))
	for i, k := range kinds {
		all[i] = string(k)
	}
	return strings.Join(all, ", ")
}
