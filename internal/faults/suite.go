package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ferryhq/ferry/internal/procs"
)

func (o *Options) withDefaults() {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Broker == "" {
		o.Broker = BrokerKafka
	}
	if len(o.Kinds) == 0 {
		o.Kinds = AllFaults
		if o.rabbit() {
			o.Kinds = RabbitMQFaults
		}
	}
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = 10 * time.Second // the broker accepts 6 s to 5 min
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if o.WorkerArgs == nil {
		o.WorkerArgs = func(int) []string { return nil }
	}
}

// open checks the options, opens the stack and starts a pipeline named
// name; a non-nil pipeline must be closed even when err is set.
func open(ctx context.Context, o *Options, name string) (*pipeline, *Stack, error) {
	o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, nil, err
	}
	stack, err := OpenStack(ctx)
	if err != nil {
		return nil, nil, err
	}
	p, err := newPipeline(ctx, o, stack, name)
	return p, stack, err
}

// Run runs the suite once: it loads the pipeline, injects o.Kinds at random
// times, waits for the pipeline to drain and checks the invariants. An error
// means the run could not be carried out; a broken invariant is in the
// report (Report.OK, Report.Violations).
func Run(ctx context.Context, o Options) (*Report, error) {
	p, stack, err := open(ctx, &o, "suite")
	var rep *Report
	if p != nil {
		defer func() { p.close(o.Keep || rep == nil || !rep.OK()) }()
	}
	if err != nil {
		return nil, err
	}
	r := p.newReport("Fault suite", stack)
	p.logf("seed %d: %d events over %s, faults %v", o.Seed, o.Events, o.LoadDuration, o.Kinds)
	if err := p.startRelay(ctx); err != nil {
		return nil, err
	}
	if err := p.startWorkers(ctx, o.Workers, o.WorkerArgs); err != nil {
		return nil, err
	}
	sctx, stopScrape := context.WithCancel(ctx)
	defer stopScrape()
	go p.scrapeLoop(sctx)
	if err := p.startLoad(o.Events, o.LoadDuration); err != nil {
		return nil, err
	}
	p.logf("relay, %d workers and the load generator started", o.Workers)

	in := newInjector(p, o.Seed)
	injErr := in.run(ctx, o.Kinds, p.load.Done())
	r.Faults = in.Faults()
	if injErr != nil {
		return nil, injErr
	}
	if err := p.waitLoad(ctx, r); err != nil {
		return nil, err
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	rep = r
	return rep, nil
}

// RunControl is the negative control: the relay runs with
// --unsafe-confirm-on-send, which confirms WAL positions before Kafka
// acknowledged them, and is killed while the broker is down. The records it
// had confirmed but not delivered are gone; a checker that does not report
// them lost proves nothing. The report is expected to drain and fail with
// lost events (Report.ControlCaught).
func RunControl(ctx context.Context, o Options) (*Report, error) {
	p, stack, err := open(ctx, &o, "control")
	if p != nil {
		defer func() { p.close(o.Keep) }()
	}
	if err != nil {
		return nil, err
	}
	r := p.newReport("Negative control: relay --unsafe-confirm-on-send, SIGKILLed while the broker is down", stack)
	if err := p.startRelay(ctx, "--unsafe-confirm-on-send"); err != nil {
		return nil, err
	}
	safeArgs := p.relayArgs[:len(p.relayArgs)-1]
	if err := p.startWorkers(ctx, o.Workers, o.WorkerArgs); err != nil {
		return nil, err
	}
	sctx, stopScrape := context.WithCancel(ctx)
	defer stopScrape()
	go p.scrapeLoop(sctx)
	if err := p.startLoad(o.Events, o.LoadDuration); err != nil {
		return nil, err
	}
	in := newInjector(p, o.Seed)
	if err := sleep(ctx, o.Warmup); err != nil {
		return nil, err
	}
	if o.rabbit() {
		r.Title = "Negative control (RabbitMQ): relay --unsafe-confirm-on-send, the broker frozen and SIGKILLed with publishes unconfirmed"
		if err := p.rabbitConfirmControl(ctx, in, r); err != nil {
			return nil, err
		}
	} else if err := p.kafkaConfirmControl(ctx, in, r); err != nil {
		return nil, err
	}
	if err := p.restartRelay(safeArgs); err != nil {
		return nil, err
	}
	p.logf("control: relay restarted without --unsafe-confirm-on-send")
	if err := p.waitLoad(ctx, r); err != nil {
		return nil, err
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// kafkaConfirmControl stops the broker under the unsafe relay and kills
// the relay while the broker is down.
func (p *pipeline) kafkaConfirmControl(ctx context.Context, in *injector, r *Report) error {
	o, stack := p.o, p.stack
	at := in.now()
	in.kafka = true
	defer in.healKafka()
	p.logf("control: stopping the broker under the unsafe relay")
	if err := stack.KafkaStop(ctx); err != nil {
		return err
	}
	// The unsafe relay keeps reading and confirming what it cannot deliver.
	if err := sleep(ctx, o.KafkaOutage[0]); err != nil {
		return err
	}
	pid := p.relay.Pid()
	p.relay.Kill()
	killed := in.now()
	p.logf("control: unsafe relay pid %d killed while the broker is down", pid)
	if err := stack.KafkaStart(ctx); err != nil {
		return err
	}
	in.kafka = false
	r.Faults = append(r.Faults,
		Fault{Kind: FaultKafkaStop, Target: "kafka", At: at, Healed: in.now(), Detail: "the unsafe relay keeps confirming"},
		Fault{Kind: FaultUnsafeRelayKill, Target: "relay", At: killed, Healed: in.now(), Detail: fmt.Sprintf("pid %d; restarted without the unsafe flag", pid)})
	return nil
}

// RunWorkerControl is the other negative control: a worker started with
// --unsafe-commit-before-db commits each batch's Kafka offset before its
// database transaction, and is killed while batches are in flight (a delay
// in the effect keeps them in flight). The restarted worker, a safe one,
// resumes after offsets whose effects never committed. The report is
// expected to drain and fail with lost events (Report.ControlCaught).
func RunWorkerControl(ctx context.Context, o Options) (*Report, error) {
	p, stack, err := open(ctx, &o, "wcontrol")
	if p != nil {
		defer func() { p.close(o.Keep) }()
	}
	if err != nil {
		return nil, err
	}
	unsafe := "--unsafe-commit-before-db"
	if o.rabbit() {
		unsafe = "--unsafe-ack-before-db" // its RabbitMQ twin: the ack before the transaction
	}
	r := p.newReport("Negative control: worker "+unsafe+", SIGKILLed with batches in flight", stack)
	if o.rabbit() {
		r.Title = "Negative control (RabbitMQ): worker " + unsafe + ", SIGKILLed with batches in flight"
	}
	if err := p.startRelay(ctx); err != nil {
		return nil, err
	}
	if err := p.startWorkers(ctx, 1, func(int) []string { return []string{unsafe, "--batch-size", "20"} }); err != nil {
		return nil, err
	}
	sctx, stopScrape := context.WithCancel(ctx)
	defer stopScrape()
	go p.scrapeLoop(sctx)
	if err := p.startLoad(o.Events, o.LoadDuration); err != nil {
		return nil, err
	}
	if err := sleep(ctx, o.Warmup); err != nil {
		return nil, err
	}
	w := p.workers[0]
	at, pid := time.Since(p.t0), w.proc.Pid()
	if err := p.replaceWorker(w, 0, []string{"--batch-size", "20"}); err != nil {
		return nil, err
	}
	p.logf("control: unsafe worker pid %d killed with batches in flight; restarted without the unsafe flag", pid)
	r.Faults = append(r.Faults, Fault{Kind: FaultUnsafeWorkerKill, Target: w.name, At: at, Healed: time.Since(p.t0),
		Detail: fmt.Sprintf("pid %d; restarted without the unsafe flag", pid)})
	if err := p.waitLoad(ctx, r); err != nil {
		return nil, err
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

func (p *pipeline) newReport(title string, s *Stack) *Report {
	if p.o.rabbit() {
		return &Report{Title: title, Run: p.name, Seed: p.o.Seed, Broker: BrokerRabbitMQ,
			Stack: s.PGVersion + ", RabbitMQ " + s.RabbitMQVersion + fmt.Sprintf(" (%d shards)", p.o.shards())}
	}
	return &Report{Title: title, Run: p.name, Seed: p.o.Seed, Broker: BrokerKafka, Stack: s.PGVersion + ", Apache Kafka " + s.KafkaVersion}
}

// waitLoad waits for the load generator to exit and reads its result.
func (p *pipeline) waitLoad(ctx context.Context, r *Report) error {
	if err := p.load.Wait(ctx); err != nil {
		return fmt.Errorf("load generator: %w (log %s)", err, p.load.LogFile())
	}
	b, err := os.ReadFile(p.loadResultFile())
	if err != nil {
		return fmt.Errorf("load generator result: %w", err)
	}
	if err := json.Unmarshal(b, &r.Load); err != nil {
		return fmt.Errorf("load generator result: %w", err)
	}
	p.logf("load done: %d events in %d transactions in %.1fs", r.Load.EventsCommitted, r.Load.TxCommitted, r.Load.Seconds)
	return nil
}

// finish drains the pipeline, stops the processes and checks.
func (p *pipeline) finish(ctx context.Context, r *Report) error {
	loadEnd := time.Now()
	var lastHeal time.Duration
	for _, f := range r.Faults {
		lastHeal = max(lastHeal, f.Healed)
	}
	at, ok, err := p.drain(ctx, p.o.DrainTimeout)
	if err != nil {
		return err
	}
	r.Drained = ok
	if ok {
		r.DrainAfterFault = max(at.Sub(p.t0)-lastHeal, 0)
		r.DrainAfterLoad = max(at.Sub(loadEnd), 0)
		p.logf("drained %s after the last fault healed", r.DrainAfterFault.Round(100*time.Millisecond))
	}
	for _, w := range p.workers {
		w.scrape()
		dup, _ := w.counters()
		r.InboxDuplicates += int64(dup)
		r.Redelivered += int64(w.redelivered())
	}
	// Only the injector kills, and it restarts what it kills: a process
	// that is not running now exited by itself.
	running := []*procs.Proc{p.relay}
	for _, w := range p.workers {
		running = append(running, w.proc)
	}
	for _, pr := range running {
		if !pr.Alive() {
			r.Crashes = append(r.Crashes, fmt.Sprintf("%s exited by itself: %v (log %s)", pr.Name(), pr.Err(), pr.LogFile()))
		}
	}
	// Stop cleanly: SIGTERM drains and commits.
	var errs []error
	for _, w := range p.workers {
		if err := w.proc.Stop(30 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.relay.Stop(30 * time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		p.logf("stopping: %v", err)
	}
	// A RabbitMQ queue cannot be read again: the duplicates it delivered
	// are the workers' counters (Report.Redelivered, InboxDuplicates).
	if !p.o.rabbit() {
		if r.TopicRecords, r.TopicDistinct, err = p.scanTopic(ctx); err != nil {
			return err
		}
	}
	if err := p.check(ctx, r); err != nil {
		return err
	}
	r.Elapsed = time.Since(p.t0)
	return nil
}
