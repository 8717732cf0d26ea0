package faults

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration/bridge"
	"github.com/ferryhq/ferry/outbox"
)

// A migration run from RabbitMQ with Options.Foreign aggregates has a
// producer that is not Ferry's: it publishes versioned events of its own
// aggregates (frn-000, ...) to the run's exchange on the old channel,
// each with a message id, each confirmed before the next (so each
// aggregate's order is the one it publishes in), and publishes one again
// until it is confirmed across the broker's faults. It records each event
// in fault_foreign (and its aggregate's version in fault_versions) before
// it publishes it, so the checker holds those events to the same
// invariants as Ferry's. `relay bridge`, started while the plan is
// OLD_ONLY, copies them to the new channel.

// foreignName is the id of foreign aggregate i.
func foreignName(i int) string { return fmt.Sprintf("frn-%03d", i) }

// foreignEvery paces the foreign producer.
const foreignEvery = 40 * time.Millisecond

// startBridge starts `relay bridge` for plan and waits until it is ready
// (its queues declared on the old channel).
func (p *pipeline) startBridge(ctx context.Context, plan string) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	p.bridgeConsumer = bridge.GroupPrefix + plan
	p.rabbitTopics = append(p.rabbitTopics, rabbitTopic{p.topic, []string{p.bridgeConsumer}})
	args := []string{"bridge", "--plan", plan, "--topics", p.topic, "--topic-map", p.topic + "=" + p.newTopic,
		"--http-addr", addr, "--step-interval", "200ms"}
	p.bridge, err = procs.Start(procs.Spec{Name: "bridge", Path: p.o.Bins.Relay, Args: args, Env: p.childEnv(),
		LogFile: filepath.Join(p.dir, "bridge.log")})
	if err != nil {
		return err
	}
	return p.waitReady(ctx, p.bridge, addr)
}

// oldQueueConsumers are the consumers of the old channel's queues: the
// groups, and the bridge's.
func (p *pipeline) oldQueueConsumers() []string {
	if p.bridgeConsumer == "" {
		return p.consumers
	}
	return append(slices.Clone(p.consumers), p.bridgeConsumer)
}

type foreignProducer struct {
	p         *pipeline
	m         *MigrationFigures
	stopc     chan struct{}
	done      chan error
	published atomic.Int64
}

// startForeign starts the foreign producer; stop ends it.
func (p *pipeline) startForeign(ctx context.Context, m *MigrationFigures) *foreignProducer {
	f := &foreignProducer{p: p, m: m, stopc: make(chan struct{}), done: make(chan error, 1)}
	go func() { f.done <- f.run(ctx) }()
	return f
}

// stop ends the producer after its current event is confirmed.
func (f *foreignProducer) stop() error {
	close(f.stopc)
	err := <-f.done
	f.m.ForeignPublished = f.published.Load()
	f.p.logf("foreign producer: %d events published to %s", f.m.ForeignPublished, f.p.topic)
	return err
}

func (f *foreignProducer) run(ctx context.Context) error {
	p := f.p
	versions := make([]int64, p.o.Foreign)
	var conn *amqp.Connection
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	var ch *amqp.Channel
	for i := 0; ; i++ {
		select {
		case <-f.stopc:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		a := i % len(versions)
		versions[a]++
		agg, id := foreignName(a), uuid.New()
		if err := retry(ctx, func(ctx context.Context) error {
			tx, err := p.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `INSERT INTO fault_foreign (id, aggregate_id, version) VALUES ($1, $2, $3)`, id, agg, versions[a]); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE fault_versions SET version = $2 WHERE aggregate_id = $1`, agg, versions[a]); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}); err != nil {
			return fmt.Errorf("foreign producer: record %s v%d: %w", agg, versions[a], err)
		}
		pub := amqp.Publishing{MessageId: id.String(), Headers: amqp.Table{outbox.HeaderAggregateID: agg},
			Body: encodeBody(eventBody{Kind: KindVersioned, Aggregate: agg, Version: versions[a]}, nil), DeliveryMode: amqp.Persistent}
		key := rabbitmq.RoutingKey(rabbitmq.Shard([]byte(agg), p.o.shards()))
		for attempt := 0; ; attempt++ {
			if ch == nil {
				c, err := p.dialRabbit(ctx, "foreign producer")
				if err != nil {
					return fmt.Errorf("foreign producer: %w", err)
				}
				conn = c
				if ch, err = conn.Channel(); err == nil {
					err = ch.Confirm(false)
				}
				if err != nil {
					_ = conn.Close()
					conn, ch = nil, nil
					continue
				}
			}
			if f.publish(ctx, ch, key, pub) {
				break
			}
			_ = conn.Close() // the outcome is unknown: published again, with the same id
			conn, ch = nil, nil
			if err := sleep(ctx, 500*time.Millisecond); err != nil {
				return err
			}
		}
		f.published.Add(1)
		if err := sleep(ctx, foreignEvery); err != nil {
			return err
		}
	}
}

// publish publishes pub and waits up to ten seconds for its confirm.
func (f *foreignProducer) publish(ctx context.Context, ch *amqp.Channel, key string, pub amqp.Publishing) bool {
	dc, err := ch.PublishWithDeferredConfirm(f.p.topic, key, false, false, pub)
	if err != nil {
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ok, err := dc.WaitContext(wctx)
	return err == nil && ok
}
