package inbox

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// deadLetterTail follows, during a live migration, the dead-letter topics
// of the topics the worker's consumers read on its own cluster (the
// migration's old channel). They are part of the drain: a dead letter left
// there goes with the old cluster, so the shadow report counts those never
// applied since (Report.OldDeadLetters) and the controller's drain waits
// for none. It starts with the first report of a plan and reads every
// topic from its start.
type deadLetterTail struct {
	w      *Worker
	topics []string
	cl     *kgo.Client

	once  sync.Once
	mu    sync.Mutex
	ids   map[string]map[string]time.Time // consumer -> message id -> failed at
	next  map[string]map[int32]int64      // topic -> partition -> next offset to read
	ready chan struct{}                   // closed once the client runs
}

// deadLetterWait bounds how long a report waits for the tail to read the
// dead-letter topics up to their end: past it, the report says "unknown".
const deadLetterWait = 5 * time.Second

func newDeadLetterTail(w *Worker, groups []*groupConsumer) *deadLetterTail {
	var topics []string
	for _, g := range groups {
		for t := range g.handlers {
			if dlq := w.cfg.DeadLetterTopic(t); !slices.Contains(topics, dlq) {
				topics = append(topics, dlq)
			}
		}
	}
	slices.Sort(topics)
	return &deadLetterTail{w: w, topics: topics, ids: map[string]map[string]time.Time{},
		next: map[string]map[int32]int64{}, ready: make(chan struct{})}
}

// start runs the tail, once, until ctx ends.
func (t *deadLetterTail) start(ctx context.Context) {
	t.once.Do(func() { t.w.runWG.Go(func() { t.run(ctx) }) })
}

// run reads the dead-letter topics until ctx ends. A topic created later
// is found at the next metadata refresh.
func (t *deadLetterTail) run(ctx context.Context) {
	cl, err := kgo.NewClient(append(slices.Clone(t.w.cfg.KafkaOpts), kgo.ConsumeTopics(t.topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMaxAge(10*time.Second))...)
	if err != nil {
		t.w.cfg.Logger.Warn("live migration: cannot read the old channel's dead-letter topics; the drain waits", "error", err.Error())
		return
	}
	defer cl.Close()
	t.cl = cl
	close(t.ready)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		t.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			if t.next[r.Topic] == nil {
				t.next[r.Topic] = map[int32]int64{}
			}
			t.next[r.Topic][r.Partition] = r.Offset + 1
			d, err := ParseDeadLetter(r)
			if err != nil || d.ID == "" || d.Consumer == "" {
				return
			}
			if t.ids[d.Consumer] == nil {
				t.ids[d.Consumer] = map[string]time.Time{}
			}
			t.ids[d.Consumer][d.ID] = d.FailedAt
		})
		t.mu.Unlock()
	}
}

// deadLetters returns the ids consumer dead-lettered at or after since on
// the dead-letter topics, once the tail read them up to their end as it is
// now; ok is false when it could not within deadLetterWait.
func (t *deadLetterTail) deadLetters(ctx context.Context, consumer string, since time.Time) (ids []string, ok bool) {
	select {
	case <-t.ready:
	case <-time.After(deadLetterWait):
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, deadLetterWait)
	defer cancel()
	adm := kadm.NewClient(t.cl)
	ends, err := adm.ListEndOffsets(ctx, t.topics...)
	if err != nil {
		return nil, false
	}
	starts, err := adm.ListStartOffsets(ctx, t.topics...)
	if err != nil {
		return nil, false
	}
	for {
		t.mu.Lock()
		behind := false
		ends.Each(func(o kadm.ListedOffset) {
			first, _ := starts.Lookup(o.Topic, o.Partition) // records before it are gone
			if o.Err == nil && max(t.next[o.Topic][o.Partition], first.Offset) < o.Offset {
				behind = true
			}
		})
		if !behind {
			for id, at := range t.ids[consumer] {
				if !at.Before(since) {
					ids = append(ids, id)
				}
			}
			t.mu.Unlock()
			slices.Sort(ids)
			return ids, true
		}
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(20 * time.Millisecond):
		}
	}
}
