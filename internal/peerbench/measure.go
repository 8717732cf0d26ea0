package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/procs"
)

// opts are the sizes of one run.
type opts struct {
	events       int   // the backlog, in one transaction
	onePerTx     int   // the second backlog, one event per transaction; 0: none
	rates        []int // events/s offered in turn after the first drain
	latencyFor   time.Duration
	drainTimeout time.Duration
}

// result is one peer's figures: those of a drain, or of a fixed rate. A
// peer's result for a round is its first drain's, with the fixed rates'
// (rates) and its second drain's (onePerTx) results.
type result struct {
	peer                         peer
	events                       int
	payloadBytes                 int
	partitions                   int32
	ready, inKafka, confirmed    time.Duration // after process start
	drainCPU, drainRSS           float64       // CPU seconds and peak RSS (MiB) when the backlog was in Kafka and confirmed
	drainMarks                   int           // confirmed position advances seen during the drain
	rate                         int           // events/s offered
	offered, matched             int
	achieved                     float64 // events/s
	p50, p95, p99, max           time.Duration
	rateCPU, rateRSS             float64       // CPU seconds per second, peak VmRSS (MiB) at the fixed rate
	brokerCPU                    float64       // the Kafka broker's CPU seconds per second at the fixed rate (what this peer's producer costs it)
	rateMarks                    int           // advances seen at the fixed rate
	markInterval, markIntervalHi time.Duration // median and longest gap between advances at the fixed rate

	rates    []*result // at each of opts.rates, after the first drain, on the same process
	onePerTx *result   // the second drain; nil when opts.onePerTx is 0
}

// marks records when a peer's confirmed position changed.
type marks struct {
	last  string
	times []time.Time
}

func (m *marks) see(mark string, at time.Time) {
	if mark != m.last {
		if m.last != "" {
			m.times = append(m.times, at)
		}
		m.last = mark
	}
}

// sumEndOffsets is how many records the topic holds: every partition's
// end offset, added up (no record is ever deleted from it during a run).
func sumEndOffsets(ctx context.Context, adm *kadm.Client, topic string) (int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	if err := ends.Error(); err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, nil
}

// measure writes the backlog, starts the peer, times its ready state, the
// backlog in Kafka and the backlog confirmed, then offers events at each
// fixed rate to the same process and times commit to a consumer's fetch;
// then, with o.onePerTx, stops it, writes a backlog one event per
// transaction and drains that from a new start.
func measure(ctx context.Context, b *bench, adm *kadm.Client, p peer, o opts) (*result, error) {
	if err := p.Prepare(ctx); err != nil {
		return nil, fmt.Errorf("%s: prepare: %w", p.Name(), err)
	}
	defer p.Close()
	if _, err := adm.CreateTopic(ctx, b.partitions, 1, nil, p.Topic()); err != nil {
		return nil, fmt.Errorf("%s: create topic: %w", p.Name(), err)
	}
	defer func() { _, _ = adm.DeleteTopics(context.Background(), p.Topic()) }()

	r, proc, err := drain(ctx, b, adm, p, o, o.events, o.events)
	if err != nil {
		return nil, err
	}
	defer func() { proc.stop() }()
	for _, rate := range o.rates {
		rr := &result{peer: p, rate: rate}
		if err := fixedRate(ctx, b, p, proc, o, rr); err != nil {
			return nil, fmt.Errorf("%s: fixed rate %d/s: %w", p.Name(), rate, err)
		}
		r.rates = append(r.rates, rr)
	}
	if o.onePerTx > 0 {
		proc.stop()
		one, again, err := drain(ctx, b, adm, p, o, o.onePerTx, 1)
		if err != nil {
			return nil, err
		}
		again.stop()
		r.onePerTx = one
	}
	return r, nil
}

// drain writes a backlog of n events in transactions of perTx, starts the
// peer and times its ready state, the backlog in Kafka and the backlog
// confirmed. The process is left running.
func drain(ctx context.Context, b *bench, adm *kadm.Client, p peer, o opts, n, perTx int) (*result, *process, error) {
	r := &result{peer: p, events: n, payloadBytes: b.payload, partitions: b.partitions}
	before, err := sumEndOffsets(ctx, adm, p.Topic())
	if err != nil {
		return nil, nil, err
	}
	log("%s: writing a backlog of %d events, %d per transaction", p.Name(), n, perTx)
	start := time.Now()
	if err := p.WriteBacklog(ctx, n, perTx); err != nil {
		return nil, nil, fmt.Errorf("%s: backlog: %w", p.Name(), err)
	}
	log("%s: backlog written in %s", p.Name(), time.Since(start).Round(time.Millisecond))

	proc, err := p.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			proc.stop()
		}
	}()
	var m marks
	deadline := time.After(o.drainTimeout)
	for r.inKafka == 0 || r.confirmed == 0 {
		if err := proc.exited(); err != nil {
			return nil, nil, err
		}
		now := time.Now()
		if r.ready == 0 {
			ok, err := p.Ready(ctx, proc)
			if err != nil {
				return nil, nil, err
			}
			if ok {
				r.ready = now.Sub(proc.started)
				log("%s: ready after %s", p.Name(), r.ready.Round(time.Millisecond))
			}
		}
		if r.inKafka == 0 {
			in, err := sumEndOffsets(ctx, adm, p.Topic())
			if err != nil {
				return nil, nil, err
			}
			if in-before >= int64(n) {
				r.inKafka = now.Sub(proc.started)
				log("%s: backlog in Kafka after %s", p.Name(), r.inKafka.Round(time.Millisecond))
			}
		}
		mark, done, err := p.Confirmed(ctx)
		if err != nil {
			return nil, nil, err
		}
		m.see(mark, now)
		if done && r.confirmed == 0 {
			r.confirmed = now.Sub(proc.started)
			log("%s: backlog confirmed after %s", p.Name(), r.confirmed.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-deadline:
			return nil, nil, fmt.Errorf("%s: backlog not drained and confirmed within %s (log %s)", p.Name(), o.drainTimeout, proc.logFile)
		case <-time.After(25 * time.Millisecond):
		}
	}
	if r.ready == 0 {
		return nil, nil, fmt.Errorf("%s: drained without ever saying it was ready (log %s)", p.Name(), proc.logFile)
	}
	if r.drainCPU, err = proc.cpuSeconds(); err != nil {
		return nil, nil, err
	}
	r.drainRSS = proc.memMB("VmHWM")
	r.drainMarks = len(m.times)
	stopped = true
	return r, proc, nil
}

// fixedRate offers r.rate events/s for o.latencyFor and times each from
// its commit returning to a consumer's fetch of its record.
func fixedRate(ctx context.Context, b *bench, p peer, proc *process, o opts, r *result) error {
	cons, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ConsumeTopics(p.Topic()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return err
	}
	defer cons.Close()
	var mu sync.Mutex
	committed, fetched := map[string]time.Time{}, map[string]time.Time{}
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for cctx.Err() == nil {
			fs := cons.PollFetches(cctx)
			now := time.Now()
			mu.Lock()
			fs.EachRecord(func(rec *kgo.Record) {
				for _, h := range rec.Headers {
					if h.Key == p.IDHeader() {
						if _, dup := fetched[string(h.Value)]; !dup {
							fetched[string(h.Value)] = now
						}
					}
				}
			})
			mu.Unlock()
		}
	}()
	defer func() { stopConsumer(); <-consumed }()
	// Let the consumer find its partitions' ends before the first event.
	time.Sleep(time.Second)

	var m marks
	var rss float64
	sctx, stopSampler := context.WithCancel(ctx)
	sampled := make(chan error, 1)
	go func() {
		var err error
		for sctx.Err() == nil && err == nil {
			var mark string
			mark, _, err = p.Confirmed(sctx)
			m.see(mark, time.Now())
			rss = max(rss, proc.memMB("VmRSS"))
			select {
			case <-sctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		sampled <- err
	}()

	broker := ferrytest.KafkaBrokerPID()
	broker0, _ := procs.CPUSeconds(broker)
	cpu0, err := proc.cpuSeconds()
	if err != nil {
		stopSampler()
		return err
	}
	start := time.Now()
	offerErr := p.Offer(ctx, r.rate, o.latencyFor, func(id string, at time.Time) {
		mu.Lock()
		committed[id] = at
		mu.Unlock()
	})
	offered := time.Since(start)
	// Wait for the stragglers, up to 30 s.
	for range 300 {
		mu.Lock()
		all := len(fetched) >= len(committed)
		mu.Unlock()
		if all {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cpu1, cpuErr := proc.cpuSeconds()
	broker1, _ := procs.CPUSeconds(broker)
	elapsed := time.Since(start)
	stopSampler()
	if err := errors.Join(offerErr, cpuErr, <-sampled); err != nil {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	for id, c := range committed {
		if f, ok := fetched[id]; ok {
			lat = append(lat, max(f.Sub(c), 0))
		}
	}
	slices.Sort(lat)
	r.offered, r.matched = len(committed), len(lat)
	r.achieved = float64(len(committed)) / offered.Seconds()
	if n := len(lat); n > 0 {
		r.p50, r.p95, r.p99, r.max = lat[n*50/100], lat[n*95/100], lat[n*99/100], lat[n-1]
	}
	r.rateCPU = (cpu1 - cpu0) / elapsed.Seconds()
	if broker > 0 {
		r.brokerCPU = (broker1 - broker0) / elapsed.Seconds()
	}
	r.rateRSS = rss
	r.rateMarks = len(m.times)
	var gaps []time.Duration
	for i := 1; i < len(m.times); i++ {
		gaps = append(gaps, m.times[i].Sub(m.times[i-1]))
	}
	if len(gaps) > 0 {
		slices.Sort(gaps)
		r.markInterval, r.markIntervalHi = gaps[len(gaps)/2], gaps[len(gaps)-1]
	}
	log("%s: %d events at %.0f/s, commit to fetch p50 %s p99 %s max %s; CPU %.3f of a core, the broker's %.3f", p.Name(), r.offered, r.achieved,
		r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond), r.max.Round(100*time.Microsecond), r.rateCPU, r.brokerCPU)
	return nil
}
