package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"time"
)

// relayServerTimeout is the relay's --server-timeout in the suite (its
// default): how long PostgreSQL keeps the walsender of a frozen relay.
const relayServerTimeout = 5 * time.Second

// firstLine returns line n (from 0) of s, or "".
func firstLine(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if n < len(lines) {
		return lines[n]
	}
	return ""
}

// FaultKind names a fault the suite injects.
type FaultKind string

// The fault kinds.
const (
	// FaultRelayKill is SIGKILL of the relay, restarted 1–3 s later.
	FaultRelayKill FaultKind = "relay-sigkill"
	// FaultWorkerKill is SIGKILL of a worker, restarted 1–3 s later.
	FaultWorkerKill FaultKind = "worker-sigkill"
	// FaultKafkaStop stops the broker for Options.KafkaOutage, then starts it.
	FaultKafkaStop FaultKind = "kafka-stop"
	// FaultKafkaBStop stops cluster B's broker (a live migration's new
	// channel) for Options.KafkaOutage, then starts it.
	FaultKafkaBStop FaultKind = "kafka-b-stop"
	// FaultPGRestart is `pg_ctl restart -m immediate`: PostgreSQL crashes and
	// recovers.
	FaultPGRestart FaultKind = "pg-restart-immediate"
	// FaultWorkerPause is SIGSTOP of a worker for longer than its group
	// session timeout, then SIGCONT: it comes back as a zombie member.
	FaultWorkerPause FaultKind = "worker-sigstop"
	// FaultRelayPause is SIGSTOP of the relay for longer than its
	// --server-timeout, then SIGCONT: PostgreSQL drops its walsender, and
	// the relay, resumed, finds its connection dead and reconnects.
	FaultRelayPause FaultKind = "relay-sigstop"
	// FaultSlotDrop is SIGKILL of the relay, its slot dropped (as a
	// failover to a server without it would), `relay recover`, and the
	// relay started again, while the load goes on.
	FaultSlotDrop FaultKind = "slot-drop-recover"
	// FaultPartitionStall is a partition that stops acknowledging: the
	// relay (built with the ferryfault tag) keeps back Kafka's answers for
	// partition 0 until its window of unconfirmed records reaches
	// --max-in-flight, and 2 s more, then hands them over. The window must
	// stay within the bound plus one transaction.
	FaultPartitionStall FaultKind = "partition-stall"
	// FaultRabbitMQStop stops the RabbitMQ node gracefully (rabbitmqctl
	// stop) for Options.KafkaOutage, then starts it.
	FaultRabbitMQStop FaultKind = "rabbitmq-stop"
	// FaultRabbitMQKill SIGKILLs the RabbitMQ node and starts it again after
	// Options.KafkaOutage: what quorum queues confirmed must survive.
	FaultRabbitMQKill FaultKind = "rabbitmq-kill"
	// FaultRabbitMQFreeze SIGSTOPs the node for longer than its clients'
	// heartbeat timeout (three 10 s heartbeats, amqp091-go's), then
	// SIGCONTs it: the relay and the workers must notice the silence and
	// start again on new connections, sending no stale acknowledgement.
	FaultRabbitMQFreeze FaultKind = "rabbitmq-freeze"
	// FaultRabbitMQUnbind unbinds shard 0's queue of every consumer from the
	// topic's exchange for 6 s, then binds them again: what the relay
	// publishes there meanwhile is unroutable. With mandatory the broker
	// returns it, and the relay holds it and publishes it again (within
	// --unknown-topic-wait): nothing may be lost. Without (the
	// no-mandatory control) it is dropped.
	FaultRabbitMQUnbind FaultKind = "rabbitmq-unbind-shard"
	// FaultUnsafeRelayKill is the negative control's SIGKILL of a relay
	// started with --unsafe-confirm-on-send, while the broker is down.
	FaultUnsafeRelayKill FaultKind = "unsafe-relay-sigkill"
	// FaultUnsafeWorkerKill is the other negative control's SIGKILL of a
	// worker started with --unsafe-commit-before-db, with batches in flight.
	FaultUnsafeWorkerKill FaultKind = "unsafe-worker-sigkill"
)

// AllFaults are the kinds Run injects by default.
var AllFaults = []FaultKind{FaultRelayKill, FaultWorkerKill, FaultKafkaStop, FaultPGRestart, FaultWorkerPause,
	FaultRelayPause, FaultSlotDrop, FaultPartitionStall}

// Fault is one injected fault.
type Fault struct {
	Kind   FaultKind
	Target string        // the process or service
	At     time.Duration // since the run started
	Healed time.Duration // when it was over: restarted, started, resumed
	Detail string
}

// injector injects faults at random times into a pipeline.
type injector struct {
	p   *pipeline
	rng *rand.Rand

	mu       sync.Mutex
	faults   []Fault
	pauses   sync.WaitGroup
	kafka    bool            // the broker is stopped
	kafkaB   bool            // cluster B's broker is stopped
	rabbit   bool            // the RabbitMQ node is stopped, killed or frozen
	loadDone <-chan struct{} // closed when the load generator finished
}

func newInjector(p *pipeline, seed uint64) *injector {
	return &injector{p: p, rng: rand.New(rand.NewPCG(seed, 0xfa17))}
}

func (in *injector) between(r [2]time.Duration) time.Duration {
	if r[1] <= r[0] {
		return r[0]
	}
	return r[0] + time.Duration(in.rng.Int64N(int64(r[1]-r[0])))
}

func (in *injector) add(f Fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults = append(in.faults, f)
}

// Faults returns what was injected so far, in order of injection.
func (in *injector) Faults() []Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]Fault(nil), in.faults...)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run injects the kinds in random order, with random gaps, after the
// warmup, in rounds: Options.Rounds of them, or for as long as loadDone is
// open. It returns once every fault has healed.
func (in *injector) run(ctx context.Context, kinds []FaultKind, loadDone <-chan struct{}) error {
	in.loadDone = loadDone
	defer in.pauses.Wait()
	defer in.healKafka()
	if err := sleep(ctx, in.p.o.Warmup); err != nil {
		return err
	}
	finished := func() bool {
		select {
		case <-loadDone:
			return true
		default:
			return false
		}
	}
	more := func(round int) bool {
		if in.p.o.Rounds > 0 {
			return round < in.p.o.Rounds
		}
		return round == 0 || !finished()
	}
	for round := 0; more(round); round++ {
		order := append([]FaultKind(nil), kinds...)
		in.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for i, k := range order {
			if round > 0 && in.p.o.Rounds == 0 && finished() {
				break
			}
			if round > 0 || i > 0 {
				if err := sleep(ctx, in.between(in.p.o.FaultGap)); err != nil {
					return err
				}
			}
			if err := in.inject(ctx, k); err != nil {
				return fmt.Errorf("inject %s: %w", k, err)
			}
		}
	}
	return nil
}

// healKafka starts the broker if a fault was interrupted while it was down.
func (in *injector) healKafka() {
	in.mu.Lock()
	down, downB, rabbit := in.kafka, in.kafkaB, in.rabbit
	in.mu.Unlock()
	if rabbit {
		in.p.stack.ensureRabbitMQ()
	}
	if down {
		in.p.stack.ensureKafka()
	}
	if downB {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = in.p.stack.KafkaBStart(ctx)
	}
}

func (in *injector) now() time.Duration { return time.Since(in.p.t0) }

func (in *injector) inject(ctx context.Context, k FaultKind) error {
	p := in.p
	switch k {
	case FaultRelayKill:
		at, pid := in.now(), p.relay.Pid()
		p.relay.Kill()
		down := in.between([2]time.Duration{time.Second, 3 * time.Second})
		p.logf("fault %s: relay pid %d killed, restart in %s", k, pid, down.Round(time.Millisecond))
		if err := sleep(ctx, down); err != nil {
			return err
		}
		if err := p.relay.Restart(); err != nil {
			return err
		}
		in.add(Fault{Kind: k, Target: "relay", At: at, Healed: in.now(), Detail: fmt.Sprintf("pid %d, down %s", pid, down.Round(time.Millisecond))})
	case FaultWorkerKill:
		w := in.pickWorker()
		if w == nil {
			p.logf("fault %s: every worker is paused, skipped", k)
			return nil
		}
		w.scrape()
		at, pid := in.now(), w.proc.Pid()
		w.proc.Kill()
		w.rollover()
		down := in.between([2]time.Duration{time.Second, 3 * time.Second})
		p.logf("fault %s: %s pid %d killed, restart in %s", k, w.name, pid, down.Round(time.Millisecond))
		if err := sleep(ctx, down); err != nil {
			return err
		}
		if err := w.proc.Restart(); err != nil {
			return err
		}
		in.add(Fault{Kind: k, Target: w.name, At: at, Healed: in.now(), Detail: fmt.Sprintf("pid %d, down %s", pid, down.Round(time.Millisecond))})
	case FaultKafkaStop:
		at := in.now()
		in.mu.Lock()
		in.kafka = true
		in.mu.Unlock()
		p.logf("fault %s: stopping the broker", k)
		if err := p.stack.KafkaStop(ctx); err != nil {
			return err
		}
		stopped := in.now()
		down := in.between(p.o.KafkaOutage)
		p.logf("fault %s: broker stopped (took %s), start in %s", k, (stopped - at).Round(time.Millisecond), down.Round(time.Millisecond))
		if err := sleep(ctx, down); err != nil {
			return err
		}
		if err := p.stack.KafkaStart(ctx); err != nil {
			return err
		}
		in.mu.Lock()
		in.kafka = false
		in.mu.Unlock()
		healed := in.now()
		p.logf("fault %s: broker started (took %s)", k, (healed - stopped - down).Round(time.Millisecond))
		in.add(Fault{Kind: k, Target: "kafka", At: at, Healed: healed, Detail: fmt.Sprintf("down %s", (healed - at).Round(100*time.Millisecond))})
	case FaultKafkaBStop:
		at := in.now()
		in.mu.Lock()
		in.kafkaB = true
		in.mu.Unlock()
		p.logf("fault %s: stopping cluster B's broker", k)
		if err := p.stack.KafkaBStop(ctx); err != nil {
			return err
		}
		down := in.between(p.o.KafkaOutage)
		if err := sleep(ctx, down); err != nil {
			return err
		}
		if err := p.stack.KafkaBStart(ctx); err != nil {
			return err
		}
		in.mu.Lock()
		in.kafkaB = false
		in.mu.Unlock()
		healed := in.now()
		p.logf("fault %s: cluster B's broker started", k)
		in.add(Fault{Kind: k, Target: "kafka-b", At: at, Healed: healed, Detail: fmt.Sprintf("down %s", (healed - at).Round(100*time.Millisecond))})
	case FaultRabbitMQStop, FaultRabbitMQKill, FaultRabbitMQFreeze:
		return in.rabbitFault(ctx, k)
	case FaultRabbitMQUnbind:
		at := in.now()
		if err := p.unbindShard(ctx, 0, false); err != nil {
			return err
		}
		p.logf("fault %s: shard 0's queues of %d consumers unbound for %s", k, len(p.consumers), unbindFor)
		serr := sleep(ctx, unbindFor)
		if err := p.unbindShard(context.WithoutCancel(ctx), 0, true); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		in.add(Fault{Kind: k, Target: "rabbitmq", At: at, Healed: in.now(), Detail: fmt.Sprintf("shard 0 of every consumer unbound for %s", unbindFor)})
	case FaultPGRestart:
		at := in.now()
		p.logf("fault %s: restarting PostgreSQL", k)
		if err := p.stack.PGRestartImmediate(ctx); err != nil {
			return err
		}
		healed := in.now()
		p.logf("fault %s: PostgreSQL back (took %s)", k, (healed - at).Round(time.Millisecond))
		in.add(Fault{Kind: k, Target: "postgresql", At: at, Healed: healed, Detail: fmt.Sprintf("down %s", (healed - at).Round(100*time.Millisecond))})
	case FaultRelayPause:
		at, pid := in.now(), p.relay.Pid()
		if err := p.relay.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		d := relayServerTimeout + in.between([2]time.Duration{2 * time.Second, 5 * time.Second})
		p.logf("fault %s: relay pid %d paused for %s (server timeout %s)", k, pid, d.Round(time.Millisecond), relayServerTimeout)
		err := sleep(ctx, d)
		if serr := p.relay.Signal(syscall.SIGCONT); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
		in.add(Fault{Kind: k, Target: "relay", At: at, Healed: in.now(), Detail: fmt.Sprintf("pid %d, paused %s", pid, d.Round(time.Millisecond))})
	case FaultSlotDrop:
		at, pid := in.now(), p.relay.Pid()
		p.relay.Kill()
		if err := p.dropSlot(ctx); err != nil {
			return err
		}
		p.logf("fault %s: relay pid %d killed, slot %s dropped; recovering", k, pid, p.slot)
		out, err := p.recoverSlot(ctx)
		if err != nil {
			return fmt.Errorf("relay recover: %w\n%s", err, out)
		}
		p.logf("fault %s: %s", k, strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
		if err := p.relay.Restart(); err != nil {
			return err
		}
		in.add(Fault{Kind: k, Target: "relay", At: at, Healed: in.now(), Detail: fmt.Sprintf("pid %d; %s", pid, firstLine(out, 1))})
	case FaultPartitionStall:
		// The relay handles the signal once it runs: a relay restarted by
		// the previous fault may not yet.
		if err := p.waitReady(ctx, p.relay, p.relayAddr); err != nil {
			return err
		}
		at, pid := in.now(), p.relay.Pid()
		if err := p.relay.Signal(syscall.SIGUSR1); err != nil {
			return err
		}
		// What the broker received is counted too, not only what the relay
		// says of its window.
		before, err := p.topicEnd(ctx)
		if err != nil {
			return err
		}
		// The window fills only while events are written: once the load
		// generator finished, a burst of the same kind of transactions
		// (same aggregates, same version bookkeeping) is written here, as
		// soon as it finished during the watch: a load that ends a moment
		// after the fault began would otherwise leave the window to the
		// few events it still wrote.
		burst := make(chan error, 1)
		seed := in.rng.Uint64()
		watching, watched := context.WithCancel(ctx)
		go func() {
			select {
			case <-in.loadDone:
			case <-watching.Done():
				burst <- nil // the watch ended first: no burst
				return
			}
			_, err := RunLoad(ctx, LoadOptions{DatabaseURL: p.dbURL, Events: 2 * relayMaxInFlight, Duration: 5 * time.Second,
				Aggregates: p.o.Aggregates, Clients: p.o.Clients, MaxTx: p.o.MaxTx, Seed: seed, AbortedFile: p.abortedFile()})
			burst <- err
		}()
		// A full window is the bound less at most one transaction: the
		// relay stops reading before the transaction that would pass it.
		limit := relayMaxInFlight + p.o.MaxTx + 2 // a transaction may add a poison and a huge event
		peak, full, err := p.watchRelayWindow(ctx, relayMaxInFlight-p.o.MaxTx-2, 30*time.Second, 2*time.Second)
		watched()
		after, eerr := p.topicEnd(ctx)
		if err == nil {
			err = eerr
		}
		if serr := p.relay.Signal(syscall.SIGUSR2); serr != nil && err == nil {
			err = serr
		}
		if berr := <-burst; berr != nil && err == nil {
			err = fmt.Errorf("burst of writes: %w", berr)
		}
		if err != nil {
			return err
		}
		if !full {
			return fmt.Errorf("the relay's unconfirmed window reached only %d records in 30 s behind a partition that stopped acknowledging, "+
				"never the --max-in-flight bound %d: the fault proved nothing", peak, relayMaxInFlight)
		}
		held, sent := in.now()-at, after-before
		p.logf("fault %s: relay pid %d held partition 0's acknowledgements for %s; window peak %d, %d records reached the broker meanwhile (--max-in-flight %d, full %t)",
			k, pid, held.Round(time.Millisecond), peak, sent, relayMaxInFlight, full)
		if peak > limit {
			return fmt.Errorf("the relay's unconfirmed window reached %d records behind a partition that stopped acknowledging: "+
				"more than --max-in-flight %d plus one transaction (%d)", peak, relayMaxInFlight, limit)
		}
		// Records sent before the first held one of partition 0 may have
		// been confirmed: with 8 partitions and random keys, a few; 100 is
		// far beyond what chance gives.
		if sent > int64(limit+100) {
			return fmt.Errorf("%d records reached the broker while partition 0 did not acknowledge: more than --max-in-flight %d "+
				"plus one transaction (%d): the relay kept reading past its bound", sent, relayMaxInFlight, limit)
		}
		in.add(Fault{Kind: k, Target: "relay", At: at, Healed: in.now(),
			Detail: fmt.Sprintf("pid %d, held %s, window peak %d of %d, %d records sent meanwhile", pid, held.Round(time.Millisecond), peak, relayMaxInFlight, sent)})
	case FaultWorkerPause:
		// One pause at a time; it runs alongside the next faults.
		in.pauses.Wait()
		w := in.pickWorker()
		if w == nil {
			return nil
		}
		w.scrape()
		w.mu.Lock()
		w.paused = true
		w.mu.Unlock()
		at, pid := in.now(), w.proc.Pid()
		if err := w.proc.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		d := p.o.SessionTimeout + in.between([2]time.Duration{5 * time.Second, 10 * time.Second})
		p.logf("fault %s: %s pid %d paused for %s (session timeout %s)", k, w.name, pid, d.Round(time.Millisecond), p.o.SessionTimeout)
		in.pauses.Add(1)
		go func() {
			defer in.pauses.Done()
			_ = sleep(ctx, d)
			_ = w.proc.Signal(syscall.SIGCONT)
			w.mu.Lock()
			w.paused = false
			w.mu.Unlock()
			p.logf("fault %s: %s resumed", k, w.name)
			in.add(Fault{Kind: k, Target: w.name, At: at, Healed: in.now(), Detail: fmt.Sprintf("pid %d, paused %s", pid, d.Round(time.Millisecond))})
		}()
	default:
		return fmt.Errorf("unknown fault kind %q", k)
	}
	return nil
}

// pickWorker returns a random worker that is not paused, nil if none.
func (in *injector) pickWorker() *workerProc {
	var ok []*workerProc
	for _, w := range in.p.workers {
		w.mu.Lock()
		if !w.paused {
			ok = append(ok, w)
		}
		w.mu.Unlock()
	}
	if len(ok) == 0 {
		return nil
	}
	return ok[in.rng.IntN(len(ok))]
}

// rabbitmqHeartbeatTimeout is how long the suite's RabbitMQ clients take a
// silent broker for alive: amqp091-go gives up after three heartbeats of
// rabbitmq.HeartbeatDefault (10 s).
const rabbitmqHeartbeatTimeout = 30 * time.Second

func (in *injector) setRabbit(down bool) {
	in.mu.Lock()
	in.rabbit = down
	in.mu.Unlock()
}

// rabbitFault stops, kills or freezes the RabbitMQ node and heals it.
func (in *injector) rabbitFault(ctx context.Context, k FaultKind) error {
	p, s := in.p, in.p.stack
	at := in.now()
	in.setRabbit(true)
	var down time.Duration
	switch k {
	case FaultRabbitMQStop, FaultRabbitMQKill:
		verb, stop := "stopped", s.RabbitMQStop
		if k == FaultRabbitMQKill {
			verb, stop = "killed", s.RabbitMQKill
		}
		if err := stop(ctx); err != nil {
			return err
		}
		stopped := in.now()
		down = in.between(p.o.KafkaOutage)
		p.logf("fault %s: RabbitMQ %s (took %s), start in %s", k, verb, (stopped - at).Round(time.Millisecond), down.Round(time.Millisecond))
		if err := sleep(ctx, down); err != nil {
			return err
		}
		if err := s.RabbitMQStart(ctx); err != nil {
			return err
		}
	case FaultRabbitMQFreeze:
		if err := s.RabbitMQFreeze(ctx); err != nil {
			return err
		}
		down = rabbitmqHeartbeatTimeout + in.between([2]time.Duration{time.Second, 3 * time.Second})
		p.logf("fault %s: RabbitMQ frozen for %s (heartbeat timeout %s)", k, down.Round(time.Millisecond), rabbitmqHeartbeatTimeout)
		err := sleep(ctx, down)
		if terr := s.RabbitMQThaw(context.WithoutCancel(ctx)); terr != nil && err == nil {
			err = terr
		}
		if err != nil {
			return err
		}
	}
	in.setRabbit(false)
	healed := in.now()
	p.logf("fault %s: RabbitMQ back (down %s)", k, (healed - at).Round(time.Millisecond))
	in.add(Fault{Kind: k, Target: "rabbitmq", At: at, Healed: healed, Detail: fmt.Sprintf("down %s", (healed - at).Round(100*time.Millisecond))})
	return nil
}
