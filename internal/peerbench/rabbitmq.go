package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/stats"
	"github.com/ferryhq/ferry/relay"
)

// The markers of the RabbitMQ peers' section of docs/benchmarks.md, after
// the Kafka peers' section.
const (
	rabbitBeginMarker = "<!-- bench-peers-rabbitmq:begin -->"
	rabbitEndMarker   = "<!-- bench-peers-rabbitmq:end -->"
)

// rabbitConsumer is the consumer whose shard queues are bound to each
// peer's exchange, so that every event has a queue to go to.
const rabbitConsumer = "peers"

// rabbitTarget is the stack's RabbitMQ node: the relay and Watermill's
// forwarder publish to it when set.
type rabbitTarget struct {
	conn rabbitmq.Conn
}

func newRabbitTarget() (*rabbitTarget, error) {
	url, pw := os.Getenv(ferrytest.EnvRabbitMQURL), os.Getenv(ferrytest.EnvRabbitMQPassword)
	if url == "" || pw == "" {
		return nil, errors.New(ferrytest.EnvRabbitMQURL + " and " + ferrytest.EnvRabbitMQPassword + " are not set: a stack with RabbitMQ, or -rabbitmq=false")
	}
	return &rabbitTarget{conn: rabbitmq.Conn{URL: url, Password: pw, Name: "peerbench"}}, nil
}

var rabbitNames = rabbitmq.Names{URL: ferrytest.EnvRabbitMQURL, Password: ferrytest.EnvRabbitMQPassword}

// env is what a publishing process needs: the password, never on its
// command line.
func (r *rabbitTarget) env() []string { return []string{"FERRY_RABBITMQ_PASSWORD=" + r.conn.Password} }

// shardKeys are the routing keys of aggregates agg-0 to agg-999, the
// backlog's, with the relay's default shard count.
func shardKeys() string {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = rabbitmq.RoutingKey(rabbitmq.Shard([]byte("agg-"+strconv.Itoa(i)), relay.RabbitMQShardsDefault))
	}
	return strings.Join(keys, ",")
}

// declare makes exchange's topology for rabbitConsumer and returns what
// deletes it, and what counts the messages in its queues.
func (r *rabbitTarget) declare(exchange string) (undo func(), count func() (int, error), err error) {
	conn, err := r.conn.Dial(rabbitNames)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if err := rabbitmq.Declare(ch, &rabbitmq.Topology{Consumer: rabbitConsumer, Topics: []string{exchange}, Shards: relay.RabbitMQShardsDefault}); err != nil {
		conn.Close()
		return nil, nil, err
	}
	count = func() (int, error) {
		n := 0
		for s := range relay.RabbitMQShardsDefault {
			q, err := ch.QueueDeclarePassive(rabbitmq.QueueName(exchange, s, rabbitConsumer), true, false, false, false, nil)
			if err != nil {
				return 0, err
			}
			n += q.Messages
		}
		return n, nil
	}
	undo = func() {
		for s := range relay.RabbitMQShardsDefault {
			_, _ = ch.QueueDelete(rabbitmq.QueueName(exchange, s, rabbitConsumer), false, false, false)
		}
		_, _ = ch.QueueDelete(exchange+rabbitmq.DeadLetterStreamSuffix, false, false, false)
		_ = ch.ExchangeDelete(exchange+rabbitmq.DeadLetterExchangeSuffix, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
		conn.Close()
	}
	return undo, count, nil
}

// rabbitResult is one peer's drain into RabbitMQ.
type rabbitResult struct {
	peer             peer
	ready, confirmed time.Duration // after process start
	cpu, rss         float64       // CPU seconds start to confirmed, peak RSS (MiB)
	broker           float64       // the RabbitMQ node's CPU seconds meanwhile
	queued           int           // messages in the shard queues once confirmed
}

// measureRabbit writes the backlog, starts the peer publishing to
// RabbitMQ and times it until its confirmed position covers the backlog.
func measureRabbit(ctx context.Context, b *bench, p peer, o opts) (*rabbitResult, error) {
	r := &rabbitResult{peer: p}
	if err := p.Prepare(ctx); err != nil {
		return nil, fmt.Errorf("%s: prepare: %w", p.Name(), err)
	}
	defer p.Close()
	undo, count, err := b.rabbit.declare(p.Topic())
	if err != nil {
		return nil, fmt.Errorf("%s: declare: %w", p.Name(), err)
	}
	defer undo()
	log("%s (RabbitMQ): writing a backlog of %d events", p.Name(), o.events)
	if err := p.WriteBacklog(ctx, o.events, o.events); err != nil {
		return nil, fmt.Errorf("%s: backlog: %w", p.Name(), err)
	}
	brokerPID := ferrytest.RabbitMQPID()
	broker0, _ := procs.CPUSeconds(brokerPID)
	proc, err := p.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer proc.stop()
	deadline := time.After(o.drainTimeout)
	for r.confirmed == 0 {
		if err := proc.exited(); err != nil {
			return nil, err
		}
		now := time.Now()
		if r.ready == 0 {
			if ok, err := p.Ready(ctx, proc); err != nil {
				return nil, err
			} else if ok {
				r.ready = now.Sub(proc.started)
			}
		}
		if _, done, err := p.Confirmed(ctx); err != nil {
			return nil, err
		} else if done {
			r.confirmed = now.Sub(proc.started)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline:
			return nil, fmt.Errorf("%s: backlog not drained into RabbitMQ and confirmed within %s (log %s)", p.Name(), o.drainTimeout, proc.logFile)
		case <-time.After(25 * time.Millisecond):
		}
	}
	if r.cpu, err = proc.cpuSeconds(); err != nil {
		return nil, err
	}
	broker1, _ := procs.CPUSeconds(brokerPID)
	r.broker = broker1 - broker0
	r.rss = proc.memMB("VmHWM")
	if r.queued, err = count(); err != nil {
		return nil, err
	}
	log("%s (RabbitMQ): ready after %s, confirmed after %s, %.0f events/s, %.1f µs CPU per event, %d messages queued",
		p.Name(), r.ready.Round(time.Millisecond), r.confirmed.Round(time.Millisecond), float64(o.events)/r.confirmed.Seconds(),
		r.cpu/float64(o.events)*1e6, r.queued)
	return r, nil
}

// rabbitMarkdown is the RabbitMQ peers' section.
func rabbitMarkdown(rounds [][]*rabbitResult, o opts, payload int, started time.Time, took time.Duration, note string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	rs := rounds[0]
	col := func(i int, f func(r *rabbitResult) float64) stats.Samples {
		var s stats.Samples
		for _, round := range rounds {
			s = append(s, f(round[i]))
		}
		return s
	}
	row := func(label, verb, unit string, f func(r *rabbitResult) float64) {
		w("| %s |", label)
		for i := range rs {
			w(" %s%s |", col(i, f).Format(verb), unit)
		}
		w("\n")
	}
	ratioRow := func(label string, f func(r *rabbitResult) float64) {
		w("| %s | **1.00** |", label)
		for i := range rs[1:] {
			w(" **%s** |", stats.Ratios(col(i+1, f), col(0, f)).Format("%.2f"))
		}
		w("\n")
	}
	n := float64(o.events)
	w("## Peers on RabbitMQ: Ferry's relay and Watermill's forwarder with watermill-amqp\n\n")
	w("Written by `make bench-peers` (`go run ./internal/peerbench`, its RabbitMQ rounds; `-kafka=false -peers ferry,watermill` runs them alone) on %s, in %s.\n",
		started.UTC().Format("2006-01-02 15:04 UTC"), took.Round(time.Second))
	if note != "" {
		w("\n**%s**\n", note)
	}
	w("\nEach peer ran as a process of its own, one after the other, against the same PostgreSQL and the stack's RabbitMQ node, "+
		"each with a database of its own and an exchange of its own with the same topology bound (%d quorum shard queues of one consumer, "+
		"`rabbitmq.Declare`, declared empty before the peer starts, deleted after), routing key = the aggregate's shard, the same %d-byte "+
		"payloads on 1,000 aggregates; Watermill's events were written through its SQL publisher wrapped by the forwarder's, as in the Kafka "+
		"section. %d rounds, every peer in turn; a ratio is taken within each round. Only the drain of a %d-event backlog is measured here, "+
		"not latency at a fixed rate.\n\n", relay.RabbitMQShardsDefault, payload, len(rounds), o.events)
	w("| figure (median (min–max) of %d rounds) |", len(rounds))
	for _, r := range rs {
		w(" %s |", r.peer.Name())
	}
	w("\n|---|")
	for range rs {
		w("---|")
	}
	w("\n")
	row("ready after process start", "%.2f", " s", func(r *rabbitResult) float64 { return r.ready.Seconds() })
	row("whole backlog confirmed (slot's confirmed_flush_lsn / offsets row), after start", "%.2f", " s", func(r *rabbitResult) float64 { return r.confirmed.Seconds() })
	row("**drain rate from process start**", "%.0f", " events/s", func(r *rabbitResult) float64 { return n / r.confirmed.Seconds() })
	row("drain rate from ready", "%.0f", " events/s", func(r *rabbitResult) float64 { return n / (r.confirmed - r.ready).Seconds() })
	ratioRow("drain time / Ferry's, from start (how many times faster Ferry drains)", func(r *rabbitResult) float64 { return r.confirmed.Seconds() })
	row("**CPU per event** of the process, start to confirmed", "%.1f", " µs", func(r *rabbitResult) float64 { return r.cpu / n * 1e6 })
	ratioRow("CPU per event / Ferry's", func(r *rabbitResult) float64 { return r.cpu })
	row("the broker's CPU per event meanwhile", "%.1f", " µs", func(r *rabbitResult) float64 { return r.broker / n * 1e6 })
	row("peak RSS (VmHWM)", "%.0f", " MiB", func(r *rabbitResult) float64 { return r.rss })
	row("messages in the shard queues once confirmed", "%.0f", "", func(r *rabbitResult) float64 { return float64(r.queued) })
	w("\nFacts of the peer, not fixed here: watermill-amqp's publisher with `ConfirmDelivery` waits for each message's confirm before its " +
		"`Publish` returns (publish-and-wait: one message in flight per publishing goroutine, and the forwarder has one), and it registers no " +
		"return listener, so with `Mandatory` an unroutable message is returned by the broker and then confirmed, and the forwarder acknowledges " +
		"it as delivered. watermill-amqp derives the routing key from the topic alone, so the backlog writes each shard's events to a " +
		"destination topic of their own (`exchange|routing key`), which its exchange and routing-key generators split. Ferry's relay streams " +
		"its confirms (up to 4,096 unconfirmed per channel, 10,000 in all) and holds and then quarantines a returned event.\n")
	for _, r := range rs {
		w("\n%s:\n\n```\n%s```\n", r.peer.Name(), r.peer.Settings())
	}
	return b.String()
}
