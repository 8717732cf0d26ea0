package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/stats"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// The relay sink's bounds on publishes awaiting their confirmation
// (relay/rabbitmq_sink.go's rabbitChannelInFlight per channel, and
// --max-in-flight over all): the bare publisher holds the same.
const (
	rabbitChannelWindow = 4096
	rabbitTotalWindow   = relay.MaxInFlightRecordsDefault
)

// rabbitOpts sizes the RabbitMQ part of the benchmarks.
type rabbitOpts struct {
	events, runs, payload int // the relay's backlog, rounds, payload bytes
	shards, channels      int
	onePerTx, batched     int // messages of the worker runs
	batch                 int
	workerRuns            int
}

// rabbitConn is the stack's RabbitMQ node as its administrator user (the
// URL carries no password; the environment does).
func rabbitConn() (rabbitmq.Conn, error) {
	url, pw := os.Getenv(ferrytest.EnvRabbitMQURL), os.Getenv(ferrytest.EnvRabbitMQPassword)
	if url == "" || pw == "" {
		return rabbitmq.Conn{}, errors.New(ferrytest.EnvRabbitMQURL + " and " + ferrytest.EnvRabbitMQPassword +
			" are not set: eval \"$(scripts/stack up)\" with RabbitMQ (not FERRY_STACK_RABBITMQ=0), or -rabbitmq=false")
	}
	return rabbitmq.Conn{URL: url, Password: pw, Name: "ferrybench"}, nil
}

var rabbitNames = rabbitmq.Names{URL: ferrytest.EnvRabbitMQURL, Password: ferrytest.EnvRabbitMQPassword}

// selfCPU is this process's CPU seconds, user and system.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// topology declares consumers' shard queues bound to exchange and returns
// the function that deletes them, the exchange and its dead-letter pair.
func topology(c rabbitmq.Conn, exchange string, shards int, consumers ...string) (func(), error) {
	conn, err := c.Dial(rabbitNames)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	for _, cons := range consumers {
		if err := rabbitmq.Declare(ch, &rabbitmq.Topology{Consumer: cons, Topics: []string{exchange}, Shards: shards}); err != nil {
			return nil, err
		}
	}
	return func() {
		conn, err := c.Dial(rabbitNames)
		if err != nil {
			log("delete %s: %v", exchange, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for _, cons := range consumers {
			for s := range shards {
				_, _ = ch.QueueDelete(rabbitmq.QueueName(exchange, s, cons), false, false, false)
			}
		}
		_, _ = ch.QueueDelete(exchange+rabbitmq.DeadLetterStreamSuffix, false, false, false)
		_ = ch.ExchangeDelete(exchange+rabbitmq.DeadLetterExchangeSuffix, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	}, nil
}

// rabbitMsg is one publish: its shard and its record, rendered as the
// relay's sink renders it (rabbitmq.Publishing: persistent, message id,
// type, headers, user id, created_at) when it is sent, as the sink does.
type rabbitMsg struct {
	shard int
	rec   *kgo.Record
}

func toPublish(recs []*kgo.Record, shards int) []rabbitMsg {
	out := make([]rabbitMsg, len(recs))
	for i, rec := range recs {
		out[i] = rabbitMsg{shard: rabbitmq.Shard(rec.Key, shards), rec: rec}
	}
	return out
}

// publishConfirmed is the bare publisher: amqp091-go alone, as a
// hand-written publisher with confirms would be, doing what the relay's
// sink does to the broker. One connection, channels confirm-mode channels,
// shard s always on channel s mod channels, each message mandatory and
// persistent with the shard as routing key; up to rabbitChannelWindow
// publishes per channel and rabbitTotalWindow in all awaiting their
// confirmation, confirmations read as they stream in. It returns the time
// from the dial to the last confirmation; a nack, a return or a closed
// channel is an error.
func publishConfirmed(ctx context.Context, c rabbitmq.Conn, exchange string, msgs []rabbitMsg, shards, channels int) (time.Duration, error) {
	user := c.User()
	perCh := make([][]rabbitMsg, channels)
	for _, m := range msgs {
		perCh[m.shard%channels] = append(perCh[m.shard%channels], m)
	}
	start := time.Now()
	conn, err := c.Dial(rabbitNames)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// The first failure closes the connection, which ends every loop.
	var once sync.Once
	var firstErr error
	dead := make(chan struct{})
	fail := func(err error) {
		once.Do(func() { firstErr = err; close(dead); _ = conn.Close() })
	}
	total := make(chan struct{}, rabbitTotalWindow)
	var returned atomic.Int64
	var wg, listeners sync.WaitGroup
	for k := range channels {
		ch, err := conn.Channel()
		if err != nil {
			return 0, err
		}
		if err := ch.Confirm(false); err != nil {
			return 0, err
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, rabbitChannelWindow+1))
		returns := ch.NotifyReturn(make(chan amqp.Return, rabbitChannelWindow+1))
		listeners.Go(func() { // closed with the connection
			for range returns {
				returned.Add(1)
			}
		})
		window := make(chan struct{}, rabbitChannelWindow)
		mine := perCh[k]
		wg.Go(func() { // the channel's confirmations, in tag order
			for range mine {
				conf, ok := <-confirms
				if !ok {
					fail(fmt.Errorf("channel %d closed with publishes unconfirmed", k))
					return
				}
				if !conf.Ack {
					fail(fmt.Errorf("channel %d: nack of publish %d", k, conf.DeliveryTag))
					return
				}
				<-window
				<-total
			}
		})
		wg.Go(func() { // the channel's only publisher
			for _, m := range mine {
				select {
				case window <- struct{}{}:
				case <-dead:
					return
				}
				select {
				case total <- struct{}{}:
				case <-dead:
					return
				}
				key, pub, err := rabbitmq.Publishing(m.rec, shards, user, relay.RabbitMQMaxMessageBytesDefault)
				if err == nil {
					err = ch.PublishWithContext(ctx, exchange, key, true, false, pub)
				}
				if err != nil {
					fail(fmt.Errorf("publish on channel %d: %w", k, err))
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	fail(nil) // close: the return listeners end, having seen every return (each comes before its ack)
	listeners.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	if n := returned.Load(); n > 0 {
		return 0, fmt.Errorf("%d publishes returned unroutable: the topology is broken", n)
	}
	return elapsed, nil
}

// rabbitResult is the RabbitMQ part's figures, samples taken in rounds:
// bare publisher, relay drain.
type rabbitResult struct {
	o             rabbitOpts
	bare          samples // every run of the bare publisher, events/s: one before each round's relay, one after the last
	ceiling       samples // each round's: the faster of the two bare runs around its relay
	ceilingCost   samples // the bare publisher's CPU microseconds per event, every run
	ceilingBroker samples // the broker's CPU microseconds per event meanwhile
	ceilingAll    samples // the machine's CPU microseconds per event meanwhile
	drain         samples // the relay, backlog to confirmed in the slot, events/s
	streaming     samples // the same from the moment its walsender streams, events/s
	relayBusy     samples // the relay process's share of one core
	relayCost     samples // its CPU microseconds per event
	drainBroker   samples // the broker's CPU microseconds per event during the drain
	drainAll      samples // the machine's CPU microseconds per event during the drain
	drainRSS      samples // the relay's peak RSS, MB
	relayHeld     samples // share of the drain with the window at its limit
	workers       []workerResult
	took          time.Duration
}

func benchRabbitMQ(ctx context.Context, e *env, o rabbitOpts) (*rabbitResult, error) {
	started := time.Now()
	c, err := rabbitConn()
	if err != nil {
		return nil, err
	}
	res := &rabbitResult{o: o}
	if err := rabbitRelay(ctx, e, c, o, res); err != nil {
		return nil, err
	}
	for _, w := range []struct{ batch, n int }{{1, o.onePerTx}, {o.batch, o.batched}} {
		r, err := rabbitWorker(ctx, c, w.batch, w.n, max(o.workerRuns, 1))
		if err != nil {
			return nil, err
		}
		res.workers = append(res.workers, r)
	}
	res.took = time.Since(started)
	log("rabbitmq part took %s", res.took.Round(time.Second))
	return res, nil
}

// rabbitRelay measures the relay's drain into RabbitMQ next to the bare
// publisher: every round, the publisher sends the backlog's rows to an
// exchange of its own, then the relay (a real `relay run` process) drains
// the same rows from a slot of its own into another; each exchange has
// the same freshly declared shard queues, deleted after it.
func rabbitRelay(ctx context.Context, e *env, c rabbitmq.Conn, o rabbitOpts, res *rabbitResult) error {
	relayBin, err := e.build("github.com/ferryhq/ferry/cmd/relay", "relay")
	if err != nil {
		return err
	}
	url, drop, err := ferrytest.MainDB("bench_rabbit")
	if err != nil {
		return err
	}
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	suffix := ferrytest.Suffix()
	if _, err := pool.Exec(ctx, `CREATE PUBLICATION ferry FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
		return err
	}
	slot := func(i int) string { return fmt.Sprintf("bench_%s_rmq_%d", suffix, i) }
	for i := range o.runs {
		q, args := `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, []any{slot(i)}
		if i > 0 {
			q, args = `SELECT pg_copy_logical_replication_slot($1, $2)`, []any{slot(0), slot(i)}
		}
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			return fmt.Errorf("create slot %s: %w", slot(i), err)
		}
		defer func() { _, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot(i)) }()
	}
	log("rabbitmq: writing a backlog of %d events", o.events)
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT gen_random_uuid(), 'load', 'agg-' || (i % 1000), 'Changed', convert_to(repeat('x', $2), 'UTF8'), '{"k":"v"}'
		FROM generate_series(1, $1) i`, o.events, o.payload); err != nil {
		return err
	}
	var target string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		return err
	}
	recs, err := outboxRecords(ctx, pool)
	if err != nil {
		return err
	}
	msgs := toPublish(recs, o.shards)

	re := *e
	re.noKafka = true
	re.environ = append(append([]string(nil), e.environ...), "FERRY_RABBITMQ_PASSWORD="+c.Password)
	relayArgs := []string{"--rabbitmq-url", c.URL, "--rabbitmq-shards", strconv.Itoa(o.shards), "--rabbitmq-channels", strconv.Itoa(o.channels)}
	// The bare publisher runs before every round's relay and once after
	// the last: a round's ceiling is the faster of the two that bracket
	// its relay, so that a burst of other work on the machine during one
	// publisher run does not pass for a relay faster than its ceiling.
	var bare samples
	ceilingOnce := func(i int) error {
		exchange := fmt.Sprintf("bench.%s.c%d.load", suffix, i)
		undo, err := topology(c, exchange, o.shards, "bench")
		if err != nil {
			return err
		}
		m, self := markCPU(), selfCPU()
		elapsed, err := publishConfirmed(ctx, c, exchange, msgs, o.shards, o.channels)
		self = selfCPU() - self
		box, _, broker := m.sinceAll()
		undo()
		if err != nil {
			return fmt.Errorf("bare publisher: %w", err)
		}
		n := float64(o.events)
		rate := n / elapsed.Seconds()
		bare = append(bare, rate)
		res.ceilingCost = append(res.ceilingCost, self/n*1e6)
		res.ceilingBroker = append(res.ceilingBroker, broker/n*1e6)
		res.ceilingAll = append(res.ceilingAll, box*float64(runtime.NumCPU())*elapsed.Seconds()/n*1e6)
		log("rabbitmq run %d: ceiling: bare publisher %.0f events/s (%.1f µs CPU per event; broker %.1f µs)", i+1, rate, self/n*1e6, broker/n*1e6)
		return nil
	}
	for i := range o.runs {
		// (a) the bare publisher, the same rows to the same topology.
		if err := ceilingOnce(i); err != nil {
			return err
		}
		n := float64(o.events)

		// (b) the relay draining the same rows.
		prefix := fmt.Sprintf("bench.%s.r%d", suffix, i)
		undo, err := topology(c, prefix+".load", o.shards, "bench")
		if err != nil {
			return err
		}
		m := markCPU()
		d, w, err := drainOnce(ctx, &re, relayBin, url, pool, slot(i), prefix+".{aggregate_type}", target, relayArgs...)
		box, _, broker := m.sinceAll()
		undo()
		if err != nil {
			return err
		}
		rate := n / d.elapsed.Seconds()
		cost := w.busy * d.elapsed.Seconds() / n * 1e6
		res.drain, res.relayBusy, res.relayCost = append(res.drain, rate), append(res.relayBusy, w.busy), append(res.relayCost, cost)
		res.streaming = append(res.streaming, n/(d.elapsed-d.attached).Seconds())
		res.drainBroker = append(res.drainBroker, broker/n*1e6)
		res.drainAll = append(res.drainAll, box*float64(runtime.NumCPU())*d.elapsed.Seconds()/n*1e6)
		res.drainRSS, res.relayHeld = append(res.drainRSS, w.peakRSS), append(res.relayHeld, w.held())
		log("rabbitmq round %d: relay drain %.0f events/s (relay %.0f%% of a core, %.1f µs CPU per event; broker %.1f µs; held %.0f%%)",
			i+1, rate, w.busy*100, cost, broker/n*1e6, w.held()*100)
	}
	if err := ceilingOnce(o.runs); err != nil {
		return err
	}
	for i := range o.runs {
		res.ceiling = append(res.ceiling, max(bare[i], bare[i+1]))
		log("rabbitmq round %d: relay / bare publisher %.2f", i+1, res.drain[i]/res.ceiling[i])
	}
	res.bare = bare
	return nil
}

// outboxRecords reads the outbox as the relay's records (relay/inflight.go
// fill): key = aggregate id, value = payload, Ferry's four headers then the
// row's, timestamp = created_at; topic left empty.
func outboxRecords(ctx context.Context, pool *pgxpool.Pool) ([]*kgo.Record, error) {
	rows, err := pool.Query(ctx, `SELECT id::text, aggregate_type, aggregate_id, event_type, payload, headers::text, created_at FROM outbox`)
	if err != nil {
		return nil, err
	}
	var recs []*kgo.Record
	for rows.Next() {
		var id, aggType, aggID, evType, headers string
		var payload []byte
		var at time.Time
		if err := rows.Scan(&id, &aggType, &aggID, &evType, &payload, &headers, &at); err != nil {
			return nil, err
		}
		var hs map[string]string
		if err := json.Unmarshal([]byte(headers), &hs); err != nil {
			return nil, err
		}
		rh := []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: []byte(id)}, {Key: outbox.HeaderEventType, Value: []byte(evType)},
			{Key: outbox.HeaderAggregateType, Value: []byte(aggType)}, {Key: outbox.HeaderAggregateID, Value: []byte(aggID)},
		}
		for k, v := range hs {
			rh = append(rh, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		recs = append(recs, &kgo.Record{Key: []byte(aggID), Value: payload, Headers: rh, Timestamp: at})
	}
	return recs, rows.Err()
}

// rabbitWorker is benchWorker on RabbitMQ: every sample, a consumer of its
// own gets its shard queues declared and filled with the n messages (by the
// bare publisher, untimed), then the SQL-only ceiling (workerCeiling, the
// same statements for the same message ids and consumer) and the worker
// run in turn from the same reset table state.
func rabbitWorker(ctx context.Context, c rabbitmq.Conn, batch, n, runs int) (workerResult, error) {
	res := workerResult{batch: batch, n: n}
	s := shapeOf(batch)
	url, drop, err := ferrytest.MainDB("bench_rabbit_worker")
	if err != nil {
		return res, err
	}
	defer drop()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return res, err
	}
	pcfg.MaxConns = int32(s.concurrency + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL, version int NOT NULL)`); err != nil {
		return res, err
	}
	// The Kafka bench's messages: key i % accounts, the outbox id header;
	// the routing key is the key's shard, as the relay sends it.
	recs := make([]*kgo.Record, n)
	for i := range n {
		key := []byte(strconv.Itoa(i % s.keys))
		recs[i] = &kgo.Record{Key: key, Value: []byte(`{"amount":1}`), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: []byte(messageID(i))}, {Key: outbox.HeaderAggregateID, Value: key},
		}}
	}
	msgs := toPublish(recs, s.partitions)
	if err := resetWorkerTables(ctx, pool); err != nil {
		return res, err
	}
	if _, err := workerCeiling(ctx, pool, "warmup", min(n, 2000), batch); err != nil {
		return res, err
	}
	rcfg := &inbox.RabbitMQConfig{URL: c.URL, Password: c.Password, Shards: s.partitions, NoCreate: true}
	exchange := "bench.worker." + ferrytest.Suffix()
	var ceilings samples
	for i := range runs {
		consumer := fmt.Sprintf("bench_%d", i)
		undo, err := topology(c, exchange, s.partitions, consumer)
		if err != nil {
			return res, err
		}
		if _, err := publishConfirmed(ctx, c, exchange, msgs, s.partitions, relay.RabbitMQChannelsDefault); err != nil {
			undo()
			return res, fmt.Errorf("fill the worker's queues: %w", err)
		}
		if err := resetWorkerTables(ctx, pool); err != nil {
			undo()
			return res, err
		}
		cm, cself := markCPU(), selfCPU()
		ceil, err := workerCeiling(ctx, pool, consumer, n, batch)
		if err != nil {
			undo()
			return res, err
		}
		cself = selfCPU() - cself
		cbox, _, _ := cm.sinceAll()
		if err := resetWorkerTables(ctx, pool); err != nil {
			undo()
			return res, err
		}
		m, self := markCPU(), selfCPU()
		r, err := runWorker(ctx, &inbox.Config{DB: pool, RabbitMQ: rcfg, Concurrency: s.concurrency, KeyConcurrency: s.keyConcurrency, BatchSize: s.batch},
			exchange, consumer, n)
		self = selfCPU() - self
		box, _, broker := m.sinceAll()
		undo()
		if err != nil {
			return res, err
		}
		ceilings, res.rate = append(ceilings, ceil), append(res.rate, r)
		// Where the worker's time goes, for the log only: this process
		// (the worker) and the broker, per message, and the machine busy.
		log("rabbitmq worker batch %d, sample %d: ceiling %.0f msg/s (its clients %.1f µs CPU per message; machine %.0f%% busy), "+
			"worker %.0f msg/s (worker process %.1f µs CPU per message, broker %.1f µs; machine %.0f%% busy)",
			batch, i+1, ceil, cself/float64(n)*1e6, cbox*100, r, self/float64(n)*1e6, broker/float64(n)*1e6, box*100)
	}
	// One more ceiling after the last worker: a sample's ceiling is the
	// faster of the two around its worker, as the relay's.
	if err := resetWorkerTables(ctx, pool); err != nil {
		return res, err
	}
	ceil, err := workerCeiling(ctx, pool, fmt.Sprintf("bench_%d", runs), n, batch)
	if err != nil {
		return res, err
	}
	ceilings = append(ceilings, ceil)
	for i := range runs {
		res.ceiling = append(res.ceiling, max(ceilings[i], ceilings[i+1]))
		log("rabbitmq worker batch %d, sample %d: worker / ceiling %.2f", batch, i+1, res.rate[i]/res.ceiling[i])
	}
	return res, nil
}

func (r *rabbitResult) markdown() string {
	var b strings.Builder
	o := r.o
	fmt.Fprintf(&b, "\n## RabbitMQ\n\nThe relay (a real `relay run --rabbitmq-url ...` process) drains a backlog written before it starts into RabbitMQ, "+
		"next to a bare publisher: amqp091-go alone, no Ferry relay code, publishing the same rows, rendered as the relay renders them, to the same topology, "+
		"sampled in turn with the relay. The RabbitMQ part took %s of this run.\n\n", r.took.Round(time.Second))
	fmt.Fprintf(&b, "| RabbitMQ relay figure (%d-event backlog, %d-byte payloads, %d shards, %d channels; median (min–max) of %d rounds: bare publisher, relay, ..., bare publisher) | value |\n|---|---|\n",
		o.events, o.payload, o.shards, o.channels, o.runs)
	fmt.Fprintf(&b, "| **ceiling: bare publisher with confirms** (one connection, %d confirm-mode channels, shard s on channel s mod %d, mandatory, persistent, up to %d in flight per channel and %d in all, confirms streamed); a round's is the faster of the runs before and after its relay | %s events/s (every run: %s), %s µs CPU per event; broker %s µs per event; machine %s µs per event |\n",
		o.channels, o.channels, rabbitChannelWindow, rabbitTotalWindow,
		r.ceiling.Format("%.0f"), r.bare.Format("%.0f"), r.ceilingCost.Format("%.1f"), r.ceilingBroker.Format("%.1f"), r.ceilingAll.Format("%.1f"))
	fmt.Fprintf(&b, "| relay drain rate, backlog to RabbitMQ confirms, confirmed in the slot | %s events/s, relay at %s%% of a core (**%s µs CPU per event**); broker %s µs per event; machine %s µs per event, every process |\n",
		r.drain.Format("%.0f"), scale(r.relayBusy, 100).Format("%.0f"), r.relayCost.Format("%.1f"), r.drainBroker.Format("%.1f"), r.drainAll.Format("%.1f"))
	fmt.Fprintf(&b, "| **drain / bare-publisher ceiling** (ratio of medians; range of the rounds' ratios) | **%.2f** (%s) |\n",
		r.drain.Median()/r.ceiling.Median(), stats.Ratios(r.drain, r.ceiling).Range("%.2f"))
	fmt.Fprintf(&b, "| the same drain timed from the moment its walsender streams (its process start, slot and dial left out), / the ceiling | %s events/s, **%.2f** (%s) |\n",
		r.streaming.Format("%.0f"), r.streaming.Median()/r.ceiling.Median(), stats.Ratios(r.streaming, r.ceiling).Range("%.2f"))
	fmt.Fprintf(&b, "| relay CPU per event / bare publisher's | %.2f (%s) |\n",
		r.relayCost.Median()/r.ceilingCost.Median(), stats.Ratios(r.relayCost, r.ceilingCost).Range("%.2f"))
	fmt.Fprintf(&b, "| broker CPU per event, relay's drain / bare publisher's | %.2f (%s) |\n",
		r.drainBroker.Median()/r.ceilingBroker.Median(), stats.Ratios(r.drainBroker, r.ceilingBroker).Range("%.2f"))
	fmt.Fprintf(&b, "| share of the drain held by the relay's window (%d unconfirmed) | %s%% |\n", relay.MaxInFlightRecordsDefault, scale(r.relayHeld, 100).Format("%.0f"))
	fmt.Fprintf(&b, "| relay peak RSS while draining | %s MB |\n", r.drainRSS.Format("%.1f"))
	fmt.Fprintf(&b, "\nBoth publish to a direct exchange with %d quorum shard queues of one consumer bound (rabbitmq.Declare: every argument explicit), declared empty before each "+
		"measurement and deleted after it; the bare publisher is timed from its dial to its last confirmation, the relay from its process start until the slot's "+
		"`confirmed_flush_lsn` reaches the backlog's end, so the relay's figure also holds its start, its slot and its exchange probe. "+
		"The bare publisher's CPU is this benchmark process's own during its run; the broker's is its beam.smp process's (`%s`).\n",
		o.shards, ferrytest.EnvRabbitMQPIDFile)
	runs := 0
	if len(r.workers) > 0 {
		runs = len(r.workers[0].rate)
	}
	fmt.Fprintf(&b, "\n| RabbitMQ worker figure (%d shard queues, concurrency %d, prefetch %d, one UPDATE per message; median (min–max) of %d samples each, ceiling and worker in turn and a ceiling after the last; a sample's ceiling is the faster of the two around it) | worker | SQL-only ceiling | worker / ceiling (range of the pairs) |\n|---|---|---|---|\n",
		workerPartitions, workerConcurrency, inbox.RabbitMQPrefetchDefault, runs)
	for _, w := range r.workers {
		what := "one message per transaction"
		if w.batch > 1 {
			what = fmt.Sprintf("batches of %d messages, a savepoint each", w.batch)
		}
		fmt.Fprintf(&b, "| %s, %d messages | %s msg/s | %s msg/s | **%.2f** (%s) |\n", what, w.n,
			w.rate.Format("%.0f"), w.ceiling.Format("%.0f"), w.rate.Median()/w.ceiling.Median(), stats.Ratios(w.rate, w.ceiling).Range("%.2f"))
	}
	fmt.Fprintf(&b, "\nThe worker is an in-process `inbox.Worker` with `Config.RabbitMQ`, from shard queues filled before it starts (a consumer's own per sample) to committed "+
		"inbox row plus effect and the ack after the commit; the ceiling is the Kafka worker's (`workerCeiling`): the same statements for the same message ids and consumer, "+
		"%d clients straight to PostgreSQL, from the same truncated, refilled, vacuumed and checkpointed tables.\n", workerConcurrency)
	return b.String()
}
