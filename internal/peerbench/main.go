// Command peerbench measures Ferry's relay next to its peers, Debezium
// (PostgreSQL connector and outbox EventRouter in Kafka Connect standalone)
// and Watermill's SQL-to-Kafka forwarder, in one run on one stack, and
// writes a markdown section between the bench-peers markers of a file; then
// (-rabbitmq) Ferry's relay and Watermill's forwarder with watermill-amqp
// draining into RabbitMQ, in a section of its own (rabbitmq.go).
// scripts/bench-peers fetches Debezium's jars and builds Watermill's side;
// run it through `make bench-peers`:
//
//	scripts/bench-peers                               the full run: 200,000 events, 1,000/s for 30 s
//	scripts/bench-peers -events 20000 -latency-duration 10s -note "..."
//	scripts/bench-peers -kafka=false -peers ferry,watermill    the RabbitMQ rounds alone
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

func log(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "peerbench: "+format+"\n", args...)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	var o opts
	b := &bench{partitions: 4}
	flag.IntVar(&o.events, "events", 200_000, "backlog written before each peer starts")
	rates := flag.String("rates", "1000,5000", "events per second offered in the latency phases, one after the other, one event per transaction")
	flag.IntVar(&o.onePerTx, "one-per-tx-events", 100_000, "then a second backlog, one event per transaction, drained from a new start of each peer; 0 skips it")
	flag.DurationVar(&o.latencyFor, "latency-duration", 30*time.Second, "length of the latency phase")
	flag.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Minute, "how long a peer may take to drain and confirm the backlog")
	flag.IntVar(&b.payload, "payload", 200, "payload bytes per event")
	peers := flag.String("peers", "ferry,debezium,watermill", "which peers to run, in this order; ferry first (the ratios are to it)")
	flag.StringVar(&b.debeziumLib, "debezium-lib", "", "directory of Kafka Connect's and Debezium's jars (scripts/bench-peers fetches them)")
	flag.StringVar(&b.debeziumLog4j, "debezium-log4j", "bench/peers/debezium/log4j2.properties", "log4j2 configuration of the Connect worker")
	flag.StringVar(&b.java, "java", "java", "the java command for Kafka Connect")
	jvm := flag.String("jvm-opts", "-Xms256m -Xmx2g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true",
		"JVM options of Kafka Connect (connect-standalone.sh's heap and kafka-run-class.sh's performance options)")
	ferryArgs := flag.String("ferry-args", "", "more flags of Ferry's `relay run`, space-separated (e.g. \"--read-window 10ms\")")
	flag.StringVar(&b.watermill, "watermill-bin", "", "the watermill-peer binary (bench/peers/watermill; scripts/bench-peers builds it)")
	out := flag.String("out", "", "write the section between the bench-peers markers of this file (docs/benchmarks.md)")
	runs := flag.Int("runs", 3, "rounds of every peer in turn; each figure is the median (min–max) of the rounds, each ratio paired within a round")
	withKafka := flag.Bool("kafka", true, "run the peers on Kafka (Ferry, Debezium, Watermill: drain and latency)")
	withRabbit := flag.Bool("rabbitmq", true, "then run Ferry's relay and Watermill's forwarder with watermill-amqp publishing to RabbitMQ (drain only), in a section of its own")
	rabbitEvents := flag.Int("rabbitmq-events", 50_000, "backlog of the RabbitMQ rounds (Watermill's publisher waits for each confirm)")
	note := flag.String("note", "", "a line printed in bold at the top of the section, e.g. that other work shared the machine")
	flag.Parse()
	for _, f := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-rates: %q is not a positive number of events per second", f)
		}
		o.rates = append(o.rates, n)
	}
	if *runs < 1 {
		return fmt.Errorf("-runs %d: at least 1", *runs)
	}
	b.jvmOpts = strings.Fields(*jvm)
	b.relayArgs = strings.Fields(*ferryArgs)

	var rabbit *rabbitTarget
	if *withRabbit {
		var err error
		if rabbit, err = newRabbitTarget(); err != nil {
			return err
		}
	}
	admin, brokers := os.Getenv(ferrytest.EnvDatabaseURL), os.Getenv(ferrytest.EnvKafkaBrokers)
	if admin == "" || brokers == "" {
		return errors.New("FERRY_TEST_DATABASE_URL and FERRY_TEST_KAFKA_BROKERS are not set: eval \"$(scripts/stack up)\" first")
	}
	b.brokers = strings.Split(brokers, ",")
	b.suffix = ferrytest.Suffix()
	var err error
	if b.dir, err = os.MkdirTemp("", "peerbench"); err != nil {
		return err
	}
	log("scratch directory (logs, configuration) %s", b.dir)

	names := strings.Split(*peers, ",")
	if _, err := newPeers(b, names); err != nil {
		return err
	}
	b.relayBin = filepath.Join(b.dir, "relay")
	if out, err := exec.Command("go", "build", "-o", b.relayBin, "./cmd/relay").CombinedOutput(); err != nil {
		return fmt.Errorf("build the relay: %v\n%s", err, out)
	}

	kcl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		return err
	}
	defer kcl.Close()
	adm := kadm.NewClient(kcl)

	base, baseDir := b.suffix, b.dir
	if *withKafka {
		if err := kafkaRounds(ctx, b, adm, names, o, *runs, admin, *note, *out); err != nil {
			return err
		}
	}
	if rabbit != nil {
		var rnames []string
		for _, n := range names {
			if n == "ferry" || n == "watermill" {
				rnames = append(rnames, n)
			}
		}
		ro := o
		ro.events = *rabbitEvents
		b.rabbit = rabbit
		if err := rabbitRounds(ctx, b, rnames, ro, *runs, *note, *out, base, baseDir); err != nil {
			return err
		}
	}
	return os.RemoveAll(baseDir)
}

// newPeers makes the named peers, Ferry's relay first.
func newPeers(b *bench, names []string) ([]peer, error) {
	var ps []peer
	for _, name := range names {
		switch name {
		case "ferry":
			ps = append(ps, &ferryPeer{b: b})
		case "debezium":
			if b.debeziumLib == "" {
				return nil, errors.New("-debezium-lib is not set: run scripts/bench-peers, which fetches the jars")
			}
			ps = append(ps, &debeziumPeer{b: b})
		case "watermill":
			if b.watermill == "" {
				return nil, errors.New("-watermill-bin is not set: run scripts/bench-peers, which builds it")
			}
			ps = append(ps, &watermillPeer{b: b})
		default:
			return nil, fmt.Errorf("unknown peer %q (ferry, debezium, watermill)", name)
		}
	}
	if len(ps) == 0 || ps[0].Name() != (&ferryPeer{}).Name() {
		return nil, errors.New("-peers must start with ferry: the ratios are to Ferry's relay")
	}
	return ps, nil
}

// kafkaRounds runs the peers on Kafka, every peer in turn each round, and
// writes their section.
func kafkaRounds(ctx context.Context, b *bench, adm *kadm.Client, names []string, o opts, runs int, admin, note, out string) error {
	started := time.Now()
	base, baseDir := b.suffix, b.dir
	var rounds [][]*result
	for i := range runs {
		// Every round gives each peer a new database, slot and topic, and
		// runs the peers in turn, so that each round's ratios compare
		// processes that shared the machine's state of the moment. Each
		// round has a directory of its own for the peers' files: Kafka
		// Connect's log told the next round it was ready at once, and its
		// offsets file would have carried a position over.
		b.suffix = fmt.Sprintf("%s_r%d", base, i)
		b.dir = filepath.Join(baseDir, fmt.Sprintf("round-%d", i+1))
		if err := os.MkdirAll(b.dir, 0o755); err != nil {
			return err
		}
		ps, _ := newPeers(b, names)
		var rs []*result
		for _, p := range ps {
			log("round %d of %d: %s", i+1, runs, p.Name())
			r, err := measure(ctx, b, adm, p, o)
			if err != nil {
				return fmt.Errorf("%w (logs in %s)", err, b.dir)
			}
			rs = append(rs, r)
		}
		rounds = append(rounds, rs)
	}
	section := markdown(rounds, o, versions(ctx, b, admin), machine(), started, time.Since(started), note)
	fmt.Print(section)
	if out != "" {
		if err := splice(out, section); err != nil {
			return err
		}
		log("wrote %s", out)
	}
	return nil
}

// rabbitRounds runs the peers publishing to RabbitMQ, every peer in turn
// each round, and writes their section.
func rabbitRounds(ctx context.Context, b *bench, names []string, o opts, runs int, note, out, base, baseDir string) error {
	started := time.Now()
	var rounds [][]*rabbitResult
	for i := range runs {
		b.suffix = fmt.Sprintf("%s_q%d", base, i)
		b.dir = filepath.Join(baseDir, fmt.Sprintf("rabbitmq-round-%d", i+1))
		if err := os.MkdirAll(b.dir, 0o755); err != nil {
			return err
		}
		ps, err := newPeers(b, names)
		if err != nil {
			return err
		}
		var rs []*rabbitResult
		for _, p := range ps {
			log("RabbitMQ round %d of %d: %s", i+1, runs, p.Name())
			r, err := measureRabbit(ctx, b, p, o)
			if err != nil {
				return fmt.Errorf("%w (logs in %s)", err, b.dir)
			}
			rs = append(rs, r)
		}
		rounds = append(rounds, rs)
	}
	section := rabbitMarkdown(rounds, o, b.payload, started, time.Since(started), note)
	fmt.Print(section)
	if out != "" {
		if err := spliceBetween(out, rabbitBeginMarker, rabbitEndMarker, section); err != nil {
			return err
		}
		log("wrote %s", out)
	}
	return nil
}
