package inbox

import (
	"context"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/commitpoint"
)

// partition applies the records of one owned partition. Records go to
// lanes by key (one lane unless Config.KeyConcurrency > 1); each lane
// applies its records in offset order, so one key's messages never
// overtake each other. The offset tracker commits only past finished
// records.
type partition struct {
	g       *groupConsumer
	w       *Worker
	topic   string
	id      int32
	handler Handler
	locks   func(*Message) []string // HandleOpts.Locks; nil takes no lock
	log     *slog.Logger
	metrics *partitionMetrics
	// rmq is the RabbitMQ channel whose deliveries the partition holds (its
	// offsets are that channel's delivery tags); nil on Kafka.
	rmq *amqp.Channel
	// requeued are the tags the negative control UnsafeRequeueRetries
	// gave back to the broker (guarded by mu).
	requeued map[int64]bool

	// stopCtx ends when the partition must take no new work (revoke, lost,
	// shutdown); it wakes backoff sleeps and slot waits. workCtx ends later,
	// when transactions still running must be cancelled.
	stopCtx    context.Context
	stopNow    context.CancelFunc
	workCtx    context.Context
	cancelWork context.CancelFunc
	done       chan struct{} // closed when every lane returned

	mu            sync.Mutex
	lanes         []*lane
	tracker       commitpoint.Tracker
	bufferedBytes int
	paused        bool
	highWatermark int64
	lastCommitted kgo.EpochOffset

	// stuckLanes counts the lanes retrying a dead letter (or a park) that
	// will not go through; stuckWhy is the first one's reason, for Ready.
	stuckLanes int
	stuckWhy   string
}

type lane struct {
	queue []fetched
	wake  chan struct{}
}

// fetched is a record waiting in a lane.
type fetched struct {
	rec      *kgo.Record
	received time.Time
}

func newPartition(g *groupConsumer, topic string, id int32, h handling) *partition {
	p := &partition{
		g:             g,
		w:             g.w,
		topic:         topic,
		id:            id,
		handler:       h.handler,
		locks:         h.locks,
		log:           g.log.With(slog.String("topic", topic), slog.Int("partition", int(id))),
		metrics:       g.w.metrics.forPartition(g.name, topic, id),
		done:          make(chan struct{}),
		tracker:       commitpoint.New(),
		lastCommitted: kgo.EpochOffset{Epoch: -1, Offset: -1},
	}
	p.stopCtx, p.stopNow = context.WithCancel(context.Background())
	p.workCtx, p.cancelWork = context.WithCancel(context.Background())
	p.lanes = make([]*lane, g.w.cfg.KeyConcurrency)
	var wg sync.WaitGroup
	for i := range p.lanes {
		l := &lane{wake: make(chan struct{}, 1)}
		p.lanes[i] = l
		wg.Go(func() { p.runLane(l) })
	}
	go func() {
		wg.Wait()
		close(p.done)
	}()
	return p
}

// enqueue hands fetched records to their lanes; it never blocks. A
// partition holding MaxBufferedBytesPerPartition pauses its fetching until
// its lanes are down to half of it.
func (p *partition) enqueue(recs []*kgo.Record, highWatermark int64, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.highWatermark = highWatermark
	for _, r := range recs {
		p.tracker.Add(r.Offset, r.LeaderEpoch)
		l := p.laneOf(r.Key)
		l.queue = append(l.queue, fetched{r, now})
		p.bufferedBytes += recordSize(r)
	}
	for _, l := range p.lanes {
		if len(l.queue) > 0 {
			select {
			case l.wake <- struct{}{}:
			default:
			}
		}
	}
	// RabbitMQ needs no pause: the prefetch bounds what a channel holds.
	if !p.paused && p.bufferedBytes >= p.w.cfg.MaxBufferedBytesPerPartition && p.g.src.pause(p) {
		p.paused = true
		p.w.metrics.nPauses.Add(1)
		p.w.metrics.pauses.WithLabelValues(p.g.name).Inc()
	}
}

func (p *partition) laneOf(key []byte) *lane {
	if len(p.lanes) == 1 {
		return p.lanes[0]
	}
	h := fnv.New32a()
	_, _ = h.Write(key)
	return p.lanes[h.Sum32()%uint32(len(p.lanes))]
}

// next waits for up to limit records of l; nil when the partition stops.
func (p *partition) next(l *lane, limit int) []fetched {
	for {
		if p.stopCtx.Err() != nil {
			return nil
		}
		p.mu.Lock()
		if n := min(len(l.queue), limit); n > 0 {
			out := make([]fetched, n)
			copy(out, l.queue)
			l.queue = l.queue[n:]
			if len(l.queue) == 0 {
				l.queue = nil // let the backing array go
			}
			p.mu.Unlock()
			return out
		}
		p.mu.Unlock()
		select {
		case <-l.wake:
		case <-p.stopCtx.Done():
			return nil
		}
	}
}

// recordSize is what a buffered record costs, roughly: its bytes plus the
// bookkeeping around it.
func recordSize(r *kgo.Record) int {
	n := 128 + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// finish marks one record as finished: applied, skipped as a duplicate or
// dead-lettered. Only then may its offset be committed.
func (p *partition) finish(r *kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tracker.Finish(r.Offset)
	p.bufferedBytes -= recordSize(r)
	if p.paused && p.bufferedBytes <= p.w.cfg.MaxBufferedBytesPerPartition/2 && p.stopCtx.Err() == nil {
		p.paused = false
		p.g.src.resume(p)
	}
	p.g.src.finished(p, r)
}

// stop makes the partition take no new work and wakes its sleeps.
func (p *partition) stop() { p.stopNow() }

// cancel also cancels the transactions still running.
func (p *partition) cancel() {
	p.stopNow()
	p.cancelWork()
}

// stick marks one lane unable to move past a message, for why.
func (p *partition) stick(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stuckLanes == 0 {
		p.stuckWhy = why
		p.w.metrics.stuck.WithLabelValues(p.g.name).Inc()
	}
	p.stuckLanes++
}

// unstick ends a stick.
func (p *partition) unstick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stuckLanes--
	if p.stuckLanes == 0 {
		p.stuckWhy = ""
		p.w.metrics.stuck.WithLabelValues(p.g.name).Dec()
	}
}

// stuckReason returns why the partition cannot move, "" when it can.
func (p *partition) stuckReason() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stuckWhy
}

// forget releases what the partition holds in the client and the metrics
// once its lanes returned. A paused partition is resumed so that, if it is
// assigned again, fetching starts again.
func (p *partition) forget() {
	p.cancelWork()
	p.mu.Lock()
	if p.paused {
		p.paused = false
		p.g.src.resume(p)
	}
	p.mu.Unlock()
	p.metrics.forget()
}

// uncommitted returns the commit point when it moved since the last commit.
func (p *partition) uncommitted() (kgo.EpochOffset, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.tracker.Point()
	if !ok || at.Offset <= p.lastCommitted.Offset {
		return at, false
	}
	return at, true
}

func (p *partition) committed(at kgo.EpochOffset) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at.Offset > p.lastCommitted.Offset {
		p.lastCommitted = at
	}
}

// updateLag sets the lag gauge: records from the first unfinished one (or
// the commit point) to the high watermark.
func (p *partition) updateLag() {
	p.mu.Lock()
	defer p.mu.Unlock()
	from, ok := p.tracker.NextUnfinished()
	if !ok {
		at, finished := p.tracker.Point()
		if !finished {
			return
		}
		from = at.Offset
	}
	p.metrics.lag.Set(float64(max(p.highWatermark-from, 0)))
}

// sleep waits d; false when the partition stopped first.
func (p *partition) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.stopCtx.Done():
		p.w.metrics.nBackoffInterrupted.Add(1)
		return false
	}
}

// runLane applies the lane's records until the partition stops.
func (p *partition) runLane(l *lane) {
	for {
		batch := p.next(l, p.w.cfg.BatchSize)
		if batch == nil {
			return
		}
		if !p.apply(batch) {
			return
		}
	}
}
