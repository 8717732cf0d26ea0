package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/outbox"
)

// drain waits until the pipeline has nothing left to do: the relay's slot
// has confirmed every WAL position written before the call, every consumer
// group has committed the end of every partition, and the effects table has
// stopped changing. None of it presumes the pipeline is correct: a run that
// lost events drains too, and the checker then finds the loss. It returns
// when the drained state was first seen, or false after timeout.
func (p *pipeline) drain(ctx context.Context, timeout time.Duration) (time.Time, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var target string
	if err := retry(ctx, func(ctx context.Context) error {
		return p.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target)
	}); err != nil {
		return time.Time{}, false, err
	}
	var since time.Time
	lastEffects, stable := int64(-1), 0
	lastLog := time.Now()
	// The management API refreshes a queue's figures every 5 s: on
	// RabbitMQ the drained state must hold for longer than that.
	need := 3
	if p.o.rabbit() || p.o.MigrateTo == BrokerRabbitMQ {
		need = 14
	}
	for {
		done, why := p.drained(ctx, target)
		var effects int64
		if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM fault_effects`).Scan(&effects); err != nil {
			done, why = false, "count effects: "+err.Error()
		}
		switch {
		case !done:
			since, stable = time.Time{}, 0
		case since.IsZero():
			since, stable = time.Now(), 0
		case effects == lastEffects:
			stable++
		default:
			stable = 0
		}
		lastEffects = effects
		if done && stable >= need {
			return since, true, nil
		}
		if time.Since(lastLog) > 10*time.Second {
			p.logf("draining: %s; %d effects so far", why, effects)
			lastLog = time.Now()
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			p.logf("not drained after %s: %s", timeout, why)
			return time.Time{}, false, nil
		}
	}
}

// drained says whether the relay and the groups are done, and if not why.
func (p *pipeline) drained(ctx context.Context, target string) (bool, string) {
	var confirmed bool
	err := p.pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $1`,
		p.slot, target).Scan(&confirmed)
	if err != nil {
		return false, "slot: " + err.Error()
	}
	if !confirmed {
		return false, "the relay has not confirmed " + target
	}
	if p.o.rabbit() {
		if ok, why := p.queuesDone(ctx, p.topic, p.oldQueueConsumers()); !ok {
			return false, why
		}
	} else if ok, why := p.groupsDone(ctx, p.adm, p.topic); !ok {
		return false, why
	}
	switch {
	case p.newTopic == "":
	case p.o.MigrateTo == BrokerRabbitMQ:
		if ok, why := p.queuesDone(ctx, p.newTopic, p.consumers); !ok {
			return false, "new channel: " + why
		}
	default:
		if ok, why := p.groupsDone(ctx, p.admB, p.newTopic); !ok {
			return false, "cluster B: " + why
		}
	}
	return true, "drained"
}

// groupsDone says whether every consumer group committed the end of every
// partition of topic, on the cluster of adm, and if not why.
func (p *pipeline) groupsDone(ctx context.Context, adm *kadm.Client, topic string) (bool, string) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return false, "end offsets: " + err.Error()
	}
	if err := ends.Error(); err != nil {
		return false, "end offsets: " + err.Error()
	}
	for _, g := range p.consumers {
		committed, err := adm.FetchOffsets(ctx, g)
		if err == nil {
			err = committed.Error()
		}
		if err != nil {
			return false, "offsets of " + g + ": " + err.Error()
		}
		lag := int64(0)
		ends.Each(func(e kadm.ListedOffset) {
			at := int64(0)
			if c, ok := committed.Lookup(e.Topic, e.Partition); ok {
				at = c.At
			}
			lag += max(e.Offset-at, 0)
		})
		if lag > 0 {
			return false, fmt.Sprintf("group %s lags %d records", g, lag)
		}
	}
	return true, "drained"
}

// scanTopic reads the run's topic from start to end and counts the records
// and the distinct ids among them: every record beyond one per id is a
// duplicate the relay published (after a crash, it republishes what was in
// flight).
func (p *pipeline) scanTopic(ctx context.Context) (records, distinct int64, err error) {
	return p.scanTopicOn(ctx, p.adm, []kgo.Opt{kgo.SeedBrokers(p.stack.Brokers...)}, p.topic)
}

// scanTopicOn is scanTopic for any topic, on the cluster adm and opts
// reach. A live migration's fences are not events: not counted.
func (p *pipeline) scanTopicOn(ctx context.Context, adm *kadm.Client, opts []kgo.Opt, topic string) (records, distinct int64, err error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	starts := map[int32]kgo.Offset{}
	left := map[int32]int64{}
	ends.Each(func(e kadm.ListedOffset) {
		if e.Offset > 0 {
			starts[e.Partition] = kgo.NewOffset().AtStart()
			left[e.Partition] = e.Offset
		}
	})
	if len(starts) == 0 {
		return 0, 0, nil
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: starts}))...)
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	ids := make(map[uuid.UUID]struct{})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return 0, 0, fmt.Errorf("read %s: %w (%d partitions unfinished)", topic, ctx.Err(), len(left))
		}
		fs.EachError(func(_ string, _ int32, ferr error) { err = ferr })
		if err != nil {
			return 0, 0, fmt.Errorf("read %s: %w", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			if isFence(r) {
				return
			}
			records++
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderID {
					if id, perr := uuid.ParseBytes(h.Value); perr == nil {
						ids[id] = struct{}{}
					}
				}
			}
		})
	}
	return records, int64(len(ids)), nil
}

func isFence(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == route.HeaderFence {
			return true
		}
	}
	return false
}
