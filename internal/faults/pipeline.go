package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/procs"
)

// Binaries are the programs the suite runs as child processes.
type Binaries struct {
	Relay  string // cmd/relay
	Faults string // internal/faults/cmd/ferryfaults: the checker worker and the load generator
}

// BuildBinaries compiles the relay and ferryfaults into dir. The relay is
// built with the ferryfault tag, which lets the suite hold back Kafka's
// acknowledgements of one partition (relay/ackhold_ferryfault.go).
func BuildBinaries(ctx context.Context, dir string) (Binaries, error) {
	bins, err := procs.BuildTagged(ctx, dir, "ferryfault", "github.com/ferryhq/ferry/cmd/relay", "github.com/ferryhq/ferry/internal/faults/cmd/ferryfaults")
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{Relay: bins[0], Faults: bins[1]}, nil
}

// pipeline is one run's database, topics and processes.
type pipeline struct {
	o     *Options
	stack *Stack
	t0    time.Time
	name  string // run id: names the database, slot, topic and groups

	dir       string // logs and the load generator's files
	dbName    string
	dbURL     string
	pool      *pgxpool.Pool
	kcl       *kgo.Client
	adm       *kadm.Client
	topic     string
	dlq       string
	slot      string
	consumers []string

	// A live migration's new channel on cluster B (RunMigration); empty
	// otherwise.
	admB            *kadm.Client
	kclB            *kgo.Client
	newTopic, newDL string
	// rabbitTopics are the run's exchanges with the consumers of their
	// queues, deleted at the end.
	rabbitTopics []rabbitTopic
	// bridge is `relay bridge` of a run with a foreign producer, and
	// bridgeConsumer the consumer of its queues.
	bridge         *procs.Proc
	bridgeConsumer string
	// relayEnv is added to the relay's environment (a lossy new channel).
	relayEnv []string
	// lossyAggregates are the aggregates with an event a lossy channel
	// dropped: the checker holds their order apart (see LossyFigures).
	lossyAggregates []string

	relay     *procs.Proc
	relayArgs []string
	relayAddr string
	workers   []*workerProc
	load      *procs.Proc
}

// workerProc is a checker worker process and the counters scraped from it.
type workerProc struct {
	name string
	proc *procs.Proc
	addr string

	mu sync.Mutex
	// Counters of earlier incarnations, and the latest scrape of this one.
	baseDup, curDup   float64
	baseProc, curProc float64
	baseRed, curRed   float64 // RabbitMQ deliveries marked redelivered
	paused            bool
}

func (p *pipeline) logf(format string, args ...any) {
	fmt.Fprintf(p.o.Log, "faults %6.1fs  %s\n", time.Since(p.t0).Seconds(), fmt.Sprintf(format, args...))
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// newPipeline creates the run's database (migrated, with the suite's tables),
// its topic and dead-letter topic.
func newPipeline(ctx context.Context, o *Options, stack *Stack, label string) (*pipeline, error) {
	p := &pipeline{o: o, stack: stack, t0: time.Now(), name: label + "_" + ferrytest.Suffix()}
	p.dir = filepath.Join(o.WorkDir, p.name)
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, err
	}
	p.dbName = "faults_" + p.name
	url, err := ferrytest.CreateDatabase(ctx, stack.DatabaseURL, p.dbName)
	if err != nil {
		return nil, err
	}
	p.dbURL = url
	if err := ferrytest.MigrateURL(ctx, url); err != nil {
		return p, err
	}
	if p.pool, err = pgxpool.New(ctx, url); err != nil {
		return p, err
	}
	for i := range o.Consumers {
		p.consumers = append(p.consumers, fmt.Sprintf("faults.%s.c%d", p.name, i+1))
	}
	if err := createSchema(ctx, p.pool, o.Aggregates, o.Foreign, p.consumers); err != nil {
		return p, err
	}
	if p.kcl, err = kgo.NewClient(kgo.SeedBrokers(stack.Brokers...)); err != nil {
		return p, err
	}
	p.adm = kadm.NewClient(p.kcl)
	p.slot = "faults_" + p.name
	p.topic = "faults." + p.name + "." + AggregateType
	p.dlq = p.topic + ".dlq"
	if o.rabbit() {
		if err := p.declareRabbitMQ(ctx); err != nil {
			return p, err
		}
		p.logf("run %s: database %s, RabbitMQ exchange %s (%d shards, %d queues per consumer), stream %s, slot %s, logs in %s",
			p.name, p.dbName, p.topic, o.shards(), o.shards(), p.dlq, p.slot, p.dir)
		return p, nil
	}
	maxBytes := strconv.Itoa(o.TopicMaxMessageBytes)
	if err := p.createTopic(ctx, p.topic, int32(o.Partitions), map[string]*string{"max.message.bytes": &maxBytes}); err != nil {
		return p, err
	}
	if err := p.createTopic(ctx, p.dlq, 2, nil); err != nil {
		return p, err
	}
	p.logf("run %s: database %s, topic %s (%d partitions), slot %s, logs in %s", p.name, p.dbName, p.topic, o.Partitions, p.slot, p.dir)
	return p, nil
}

func (p *pipeline) createTopic(ctx context.Context, name string, partitions int32, configs map[string]*string) error {
	res, err := p.adm.CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", name, err)
	}
	return nil
}

// close stops every process and, unless keep, drops the database and topics.
func (p *pipeline) close(keep bool) {
	for _, w := range p.workers {
		w.proc.Kill()
	}
	if p.load != nil {
		p.load.Kill()
	}
	if p.bridge != nil {
		p.bridge.Kill()
	}
	if p.relay != nil {
		p.relay.Kill()
	}
	if p.pool != nil {
		p.pool.Close()
	}
	if keep {
		p.logf("kept database %s, topics %s and %s, logs in %s", p.dbName, p.topic, p.dlq, p.dir)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p.deleteRabbitMQ()
		if !p.o.rabbit() && p.adm != nil {
			_, _ = p.adm.DeleteTopics(ctx, p.topic, p.dlq)
			_, _ = p.adm.DeleteGroups(ctx, p.consumers...)
		}
		if p.dbURL != "" {
			if err := ferrytest.DropDatabase(p.stack.DatabaseURL, p.dbName); err != nil {
				p.logf("drop database: %v", err)
			}
		}
	}
	if p.kcl != nil {
		p.kcl.Close()
	}
	if p.kclB != nil {
		if !keep {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, _ = p.admB.DeleteTopics(ctx, p.newTopic, p.newDL)
			_, _ = p.admB.DeleteGroups(ctx, p.consumers...)
			cancel()
		}
		p.kclB.Close()
	}
}

func (p *pipeline) childEnv() []string {
	env := []string{"FERRY_DATABASE_URL=" + p.dbURL, "FERRY_LOG_FORMAT=json"}
	if p.stack.RabbitMQPassword != "" { // a migration plan's RabbitMQ channel names it
		env = append(env, rabbitPasswordEnv+"="+p.stack.RabbitMQPassword)
	}
	if p.o.rabbit() {
		return append(env, "FERRY_RABBITMQ_URL="+p.stack.RabbitMQURL, "FERRY_RABBITMQ_PASSWORD="+p.stack.RabbitMQPassword)
	}
	return append(env, "FERRY_KAFKA_BROKERS="+strings.Join(p.stack.Brokers, ","))
}

// startRelay starts the relay and waits until its slot streams. extra
// arguments (the negative control's flag) go after the common ones.
func (p *pipeline) startRelay(ctx context.Context, extra ...string) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	p.relayAddr = addr
	p.relayArgs = append([]string{"run", "--slot", p.slot, "--topic-template", "faults." + p.name + ".{aggregate_type}",
		"--http-addr", addr, "--max-in-flight", strconv.Itoa(relayMaxInFlight)}, p.relayChannelArgs()...)
	p.relayArgs = append(p.relayArgs, extra...)
	p.relay, err = procs.Start(procs.Spec{Name: "relay", Path: p.o.Bins.Relay, Args: p.relayArgs, Env: append(p.childEnv(), p.relayEnv...),
		LogFile: filepath.Join(p.dir, "relay.log")})
	if err != nil {
		return err
	}
	return p.waitReady(ctx, p.relay, addr)
}

// relayChannelArgs are the relay's flags of the run's broker.
func (p *pipeline) relayChannelArgs() []string {
	if p.o.rabbit() {
		return p.rabbitRelayArgs()
	}
	return nil
}

// relayMaxInFlight is the suite relay's --max-in-flight: low enough that a
// stalled partition fills the window within seconds of the load.
const relayMaxInFlight = 1500

// watchRelayWindow scrapes the relay's unconfirmed window until it reached
// full records and then for after more, or for at most limit; it returns
// the largest window seen and whether it reached full.
func (p *pipeline) watchRelayWindow(ctx context.Context, full int, limit, after time.Duration) (peak int, reached bool, err error) {
	deadline := time.Now().Add(limit)
	var until time.Time
	c := http.Client{Timeout: 2 * time.Second}
	for {
		if resp, gerr := c.Get("http://" + p.relayAddr + "/metrics"); gerr == nil {
			v, ok, perr := parseGauge(resp.Body, "ferry_relay_unconfirmed_records")
			resp.Body.Close()
			if perr != nil {
				return peak, reached, perr
			}
			if ok {
				peak = max(peak, int(v))
			}
		}
		now := time.Now()
		if !reached && peak >= full {
			reached, until = true, now.Add(after)
		}
		if (reached && now.After(until)) || now.After(deadline) {
			return peak, reached, nil
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return peak, reached, err
		}
	}
}

// topicEnd returns the sum of the run topic's end offsets: how many records
// the broker has received (each is written once, acknowledged or not).
func (p *pipeline) topicEnd(ctx context.Context) (int64, error) {
	var sum int64
	err := retry(ctx, func(ctx context.Context) error {
		ends, err := p.adm.ListEndOffsets(ctx, p.topic)
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			return err
		}
		sum = 0
		ends.Each(func(o kadm.ListedOffset) { sum += o.Offset })
		return nil
	})
	return sum, err
}

// parseGauge returns the value of an unlabelled metric in a /metrics page.
func parseGauge(r io.Reader, name string) (float64, bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[len(name):]), 64)
		if err != nil {
			return 0, false, fmt.Errorf("metrics line %q: %w", line, err)
		}
		return v, true, nil
	}
	return 0, false, sc.Err()
}

// dropSlot drops the relay's slot once its walsender has let go of it.
func (p *pipeline) dropSlot(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := p.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, p.slot)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drop slot %s: %w", p.slot, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// recoverSlot runs `relay recover` with the relay's settings and returns
// its output.
func (p *pipeline) recoverSlot(ctx context.Context) (string, error) {
	// A 5 s margin: the load's transactions take milliseconds. --force: the
	// suite never deletes outbox rows, so the window is whole; a run's
	// outbox is merely too young for the check that tells a young outbox
	// from a pruned one.
	cmd := exec.CommandContext(ctx, p.o.Bins.Relay, "recover", "--slot", p.slot,
		"--topic-template", "faults."+p.name+".{aggregate_type}", "--recover-margin", "5s", "--force")
	cmd.Env = p.childEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// restartRelay replaces the relay process with one started with args
// (nil: the same as before).
func (p *pipeline) restartRelay(args []string) error {
	if args == nil {
		return p.relay.Restart()
	}
	p.relay.Kill()
	p.relayArgs = args
	var err error
	p.relay, err = procs.Start(procs.Spec{Name: "relay", Path: p.o.Bins.Relay, Args: args, Env: append(p.childEnv(), p.relayEnv...),
		LogFile: filepath.Join(p.dir, "relay.log")})
	return err
}

// startWorkers starts n checker workers, each hosting every consumer.
// workerArgs returns extra `worker run` flags for worker i.
func (p *pipeline) startWorkers(ctx context.Context, n int, workerArgs func(i int) []string) error {
	for i := range n {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("worker-%d", i+1)
		proc, err := procs.Start(p.workerSpec(name, addr, p.o.EffectDelay, workerArgs(i)))
		if err != nil {
			return err
		}
		p.workers = append(p.workers, &workerProc{name: name, proc: proc, addr: addr})
	}
	for _, w := range p.workers {
		if err := p.waitReady(ctx, w.proc, w.addr); err != nil {
			return err
		}
	}
	return nil
}

// workerSpec is the command line of a checker worker: its effect delay
// (negative control only) and extra `worker run` flags.
func (p *pipeline) workerSpec(name, addr string, delay time.Duration, extra []string) procs.Spec {
	args := []string{"worker", "-name", name, "-topic", p.topic, "-consumers", strings.Join(p.consumers, ",")}
	if delay > 0 {
		args = append(args, "-effect-delay", delay.String())
	}
	if p.o.FailEvery > 0 {
		args = append(args, "-fail-every", strconv.Itoa(p.o.FailEvery))
	}
	args = append(args, "run", "--http-addr", addr, "--prune-interval", "0", "--offset-reset", "earliest",
		"--kafka-session-timeout", p.o.SessionTimeout.String())
	if p.o.rabbit() {
		args = append(args, p.rabbitWorkerArgs()...)
	}
	args = append(args, extra...)
	return procs.Spec{Name: name, Path: p.o.Bins.Faults, Args: args, Env: p.childEnv(), LogFile: filepath.Join(p.dir, name+".log")}
}

// replaceWorker kills worker w and starts it again with another command
// line.
func (p *pipeline) replaceWorker(w *workerProc, delay time.Duration, extra []string) error {
	w.scrape()
	w.proc.Kill()
	w.rollover()
	proc, err := procs.Start(p.workerSpec(w.name, w.addr, delay, extra))
	if err != nil {
		return err
	}
	w.proc = proc
	return nil
}

// waitReady polls /readyz until it answers 200, for at most two minutes.
func (p *pipeline) waitReady(ctx context.Context, proc *procs.Proc, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-proc.Done():
			return fmt.Errorf("%s exited while starting: %v (log %s)", proc.Name(), proc.Err(), proc.LogFile())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w (log %s)", proc.Name(), addr, ctx.Err(), proc.LogFile())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startLoad starts the load generator process.
func (p *pipeline) startLoad(events int, duration time.Duration) error {
	o := p.o
	args := []string{"load",
		"-events", strconv.Itoa(events), "-duration", duration.String(),
		"-aggregates", strconv.Itoa(o.Aggregates), "-clients", strconv.Itoa(o.Clients),
		"-max-tx", strconv.Itoa(o.MaxTx), "-poison-every", strconv.Itoa(o.PoisonEvery),
		"-huge-every", strconv.Itoa(o.HugeEvery), "-huge-bytes", strconv.Itoa(o.TopicMaxMessageBytes * 3 / 2),
		"-seed", strconv.FormatUint(o.Seed, 10),
		"-aborted", p.abortedFile(), "-result", p.loadResultFile(),
	}
	var err error
	p.load, err = procs.Start(procs.Spec{Name: "load", Path: o.Bins.Faults, Args: args, Env: p.childEnv(),
		LogFile: filepath.Join(p.dir, "load.log")})
	return err
}

func (p *pipeline) abortedFile() string    { return filepath.Join(p.dir, "aborted.jsonl") }
func (p *pipeline) loadResultFile() string { return filepath.Join(p.dir, "load.json") }

// scrape reads the worker's inbox counters; at a restart the latest values
// carry over into the base.
func (w *workerProc) scrape() {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + w.addr + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	dup, proc, red, err := parseWorkerMetrics(resp.Body)
	if err != nil {
		return
	}
	w.mu.Lock()
	w.curDup, w.curProc, w.curRed = max(w.curDup, dup), max(w.curProc, proc), max(w.curRed, red)
	w.mu.Unlock()
}

// rollover moves this incarnation's counters into the base, before a
// restart.
func (w *workerProc) rollover() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.baseDup, w.curDup = w.baseDup+w.curDup, 0
	w.baseProc, w.curProc = w.baseProc+w.curProc, 0
	w.baseRed, w.curRed = w.baseRed+w.curRed, 0
}

func (w *workerProc) counters() (dup, processed float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.baseDup + w.curDup, w.baseProc + w.curProc
}

// redelivered is the worker's ferry_worker_redelivered_total over its
// incarnations.
func (w *workerProc) redelivered() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.baseRed + w.curRed
}

// parseWorkerMetrics sums the duplicates-skipped, processed and (RabbitMQ)
// redelivered counters over every consumer and topic of a worker's
// /metrics.
func parseWorkerMetrics(r io.Reader) (dup, processed, redelivered float64, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		var sum *float64
		switch {
		case strings.HasPrefix(line, "ferry_worker_duplicates_skipped_total{"):
			sum = &dup
		case strings.HasPrefix(line, "ferry_worker_messages_processed_total{"):
			sum = &processed
		case strings.HasPrefix(line, "ferry_worker_redelivered_total{"):
			sum = &redelivered
		default:
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, perr := strconv.ParseFloat(line[i+1:], 64)
		if perr != nil {
			return 0, 0, 0, fmt.Errorf("metrics line %q: %w", line, perr)
		}
		*sum += v
	}
	return dup, processed, redelivered, sc.Err()
}

// scrapeLoop scrapes every worker each second until ctx ends.
func (p *pipeline) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		for _, w := range p.workers {
			w.mu.Lock()
			paused := w.paused
			w.mu.Unlock()
			if !paused {
				w.scrape()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// retry runs f until it succeeds or ctx ends; PostgreSQL and Kafka come and
// go during the run.
func retry(ctx context.Context, f func(context.Context) error) error {
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(qctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
