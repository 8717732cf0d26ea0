package faults

import (
	"context"
	"fmt"
	"time"
)

// The RabbitMQ negative controls. RunControl and RunWorkerControl run on
// RabbitMQ when Options.Broker says so (the relay's confirm-on-send, the
// worker's ack-before-db); RunNoMandatoryControl and RunRequeueControl are
// RabbitMQ's own.

// rabbitConfirmControl freezes the broker under the relay started with
// --unsafe-confirm-on-send, which counts a publish as acknowledged once it
// is written to the socket: while the broker is frozen the kernel's buffers
// take what the relay writes, and the relay confirms their WAL positions to
// PostgreSQL (each second). SIGKILL of the frozen broker throws the buffers
// away: those events were never enqueued, and the slot is past them. The
// relay is then killed too and restarted safe by RunControl.
func (p *pipeline) rabbitConfirmControl(ctx context.Context, in *injector, r *Report) error {
	s := p.stack
	at := in.now()
	in.setRabbit(true)
	defer in.healKafka()
	p.logf("control: freezing RabbitMQ under the unsafe relay")
	if err := s.RabbitMQFreeze(ctx); err != nil {
		return err
	}
	// Several status intervals (1 s): the written-not-confirmed positions
	// reach the slot.
	if err := sleep(ctx, p.o.KafkaOutage[0]); err != nil {
		return err
	}
	if err := s.RabbitMQKill(ctx); err != nil {
		return err
	}
	killed := in.now()
	p.logf("control: RabbitMQ SIGKILLed while frozen, with the unsafe relay's publishes unconfirmed in its buffers")
	pid := p.relay.Pid()
	p.relay.Kill()
	if err := s.RabbitMQStart(ctx); err != nil {
		return err
	}
	in.setRabbit(false)
	r.Faults = append(r.Faults,
		Fault{Kind: FaultRabbitMQKill, Target: "rabbitmq", At: at, Healed: in.now(), Detail: fmt.Sprintf("frozen %s, then SIGKILLed; the unsafe relay counted its writes as confirmed", (killed - at).Round(100*time.Millisecond))},
		Fault{Kind: FaultUnsafeRelayKill, Target: "relay", At: killed, Healed: in.now(), Detail: fmt.Sprintf("pid %d; restarted without the unsafe flag", pid)})
	return nil
}

// RabbitMQControlOptions derives the RabbitMQ controls' options from a
// RabbitMQ run's (ControlOptions'), with the broker frozen for 5 s.
func RabbitMQControlOptions(o Options) Options {
	c := ControlOptions(o)
	c.Broker = BrokerRabbitMQ
	c.Kinds = RabbitMQFaults
	return c
}

// RabbitMQWorkerControlOptions are WorkerControlOptions on RabbitMQ.
func RabbitMQWorkerControlOptions(o Options) Options {
	c := WorkerControlOptions(o)
	c.Broker = BrokerRabbitMQ
	c.Kinds = RabbitMQFaults
	return c
}

// unbindFor is how long RunNoMandatoryControl leaves a shard unbound: well
// within the relay's --unknown-topic-wait (30 s), so that a relay with
// mandatory holds the returned events and delivers all of them once the
// queues are bound again.
const unbindFor = 6 * time.Second

// RunNoMandatoryControl is the control of mandatory publishing: the relay
// runs with --unsafe-no-mandatory, and shard 0's queue of every consumer is
// unbound from the topic's exchange for unbindFor while the load runs, then
// bound again. Meanwhile shard 0's routing key reaches no queue: the broker
// confirms and drops what the relay publishes there. A relay with mandatory
// gets them back, holds them and publishes them again once they route (or
// quarantines them as unroutable); this one forgets them, and the checker
// must report them lost (Report.ControlCaught).
func RunNoMandatoryControl(ctx context.Context, o Options) (*Report, error) {
	o.Broker = BrokerRabbitMQ
	p, stack, err := open(ctx, &o, "nmcontrol")
	if p != nil {
		defer func() { p.close(o.Keep) }()
	}
	if err != nil {
		return nil, err
	}
	r := p.newReport("Negative control (RabbitMQ): relay --unsafe-no-mandatory, shard 0 unbound from every consumer for a while", stack)
	if err := p.startRelay(ctx, "--unsafe-no-mandatory"); err != nil {
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
	if err := sleep(ctx, o.Warmup); err != nil {
		return nil, err
	}
	at := time.Since(p.t0)
	if err := p.unbindShard(ctx, 0, false); err != nil {
		return nil, err
	}
	p.logf("control: shard 0's queues of %d consumers unbound for %s under the relay without mandatory", len(p.consumers), unbindFor)
	serr := sleep(ctx, unbindFor)
	// Bound again even when interrupted: the queues are the run's.
	if err := p.unbindShard(context.WithoutCancel(ctx), 0, true); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	p.logf("control: shard 0's queues bound again")
	r.Faults = append(r.Faults, Fault{Kind: FaultRabbitMQUnbind, Target: "rabbitmq", At: at, Healed: time.Since(p.t0),
		Detail: fmt.Sprintf("shard 0 of every consumer unbound for %s; the relay publishes without mandatory", unbindFor)})
	if err := p.waitLoad(ctx, r); err != nil {
		return nil, err
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// requeueFailEvery is the requeue control's Options.FailEvery: one message
// in 16 fails its first attempt.
const requeueFailEvery = 16

// RequeueControlOptions derives the requeue control's options: a short
// load, one worker applying one message per transaction, a transient
// failure of the first attempt of one message in 16.
func RequeueControlOptions(o Options) Options {
	c := RabbitMQControlOptions(o)
	c.Events, c.LoadDuration = 4000, 10*time.Second
	c.FailEvery = requeueFailEvery
	c.WorkerArgs = func(int) []string { return []string{"--batch-size", "1"} }
	return c
}

// RunRequeueControl is the control of retries in place: the worker runs
// with --unsafe-requeue-retries, which retries a failed delivery by
// Nack(requeue=true), and its handler fails the first attempt of some
// messages (Options.FailEvery). A requeued message goes to the back of its
// queue, behind the later versions of its aggregate: the checker must
// report order inversions (Report.OrderControlCaught). A safe worker holds
// the delivery and retries it in place: no inversion.
func RunRequeueControl(ctx context.Context, o Options) (*Report, error) {
	o.Broker = BrokerRabbitMQ
	if o.FailEvery == 0 {
		o.FailEvery = requeueFailEvery
	}
	p, stack, err := open(ctx, &o, "rqcontrol")
	if p != nil {
		defer func() { p.close(o.Keep) }()
	}
	if err != nil {
		return nil, err
	}
	r := p.newReport(fmt.Sprintf("Negative control (RabbitMQ): worker --unsafe-requeue-retries, the first attempt of 1 message in %d failing", o.FailEvery), stack)
	if err := p.startRelay(ctx); err != nil {
		return nil, err
	}
	if err := p.startWorkers(ctx, o.Workers, func(i int) []string { return append(o.WorkerArgs(i), "--unsafe-requeue-retries") }); err != nil {
		return nil, err
	}
	sctx, stopScrape := context.WithCancel(ctx)
	defer stopScrape()
	go p.scrapeLoop(sctx)
	if err := p.startLoad(o.Events, o.LoadDuration); err != nil {
		return nil, err
	}
	if err := p.waitLoad(ctx, r); err != nil {
		return nil, err
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}
