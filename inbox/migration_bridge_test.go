package inbox

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/migration/bridge"
	"github.com/ferryhq/ferry/outbox"
)

// foreignProducer publishes to the old RabbitMQ channel's exchange as a
// service that is not Ferry's would: four aggregates (foreign-0 to 3), each
// message's payload its aggregate's next sequence number, a third of them
// with a message id, a third with an id header, a third with no id at all
// (the workers and the bridge derive one). A bridge copies them to the new
// channel.
type foreignProducer struct {
	m         *liveMigration
	published atomic.Int64
	bridge    *bridge.Bridge
	stopOnce  func()
	done      chan error
}

// foreignBurst is how many foreign messages are published at once before
// the bridge starts: the slow old channel is still applying them when the
// first copies arrive on the new one.
const foreignBurst = 400

// startForeign starts publishing, and once some messages are on the old
// channel only, the bridge; it returns when the bridge's queues exist.
func startForeign(t *testing.T, m *liveMigration) *foreignProducer {
	t.Helper()
	f := &foreignProducer{m: m, done: make(chan error, 1)}
	ch := m.confirmChannel()
	stop := make(chan struct{})
	var once sync.Once
	f.stopOnce = func() { once.Do(func() { close(stop) }) }
	t.Cleanup(f.stopOnce)
	go func() {
		next := map[string]int{}
		for i := 0; ; i++ {
			select {
			case <-stop:
				f.done <- nil
				return
			default:
			}
			key := fmt.Sprintf("foreign-%d", i%4)
			next[key]++
			p := amqp.Publishing{Headers: amqp.Table{outbox.HeaderAggregateID: key}, Body: []byte(strconv.Itoa(next[key])),
				DeliveryMode: amqp.Persistent}
			switch i % 3 {
			case 0:
				p.MessageId = fmt.Sprintf("fx-%s-%d", key, next[key])
			case 1:
				p.Headers[outbox.HeaderID] = fmt.Sprintf("fh-%s-%d", key, next[key])
			}
			dc, err := ch.PublishWithDeferredConfirm(m.oldTopic, rabbitmq.RoutingKey(rabbitmq.Shard([]byte(key), m.rabbitOld.Shards)), false, false, p)
			if err == nil && !dc.Wait() {
				err = fmt.Errorf("message %d nacked", i)
			}
			if err != nil {
				f.done <- err
				return
			}
			if f.published.Add(1) > foreignBurst {
				// A pace, not a wait for anything: slower than the
				// worker applies the foreign aggregates on the old
				// channel (50 ms each, four at a time), so that the
				// backlog there is the burst's and does not grow for
				// as long as the test runs.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	m.waitFor("a burst of foreign messages on the old channel only", func() (bool, error) { return f.published.Load() >= foreignBurst, nil })

	group := bridge.GroupPrefix + "move"
	cleanup := &rbundle{rcfg: *m.rabbitOld, topic: m.oldTopic, consumer: group}
	t.Cleanup(cleanup.deleteTopology)
	br, err := bridge.New(&bridge.Config{Plan: "move", DB: m.db.Pool, Topics: []string{m.oldTopic},
		TopicMap: map[string]string{m.oldTopic: m.newTopic}, StepInterval: 50 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	f.bridge = br
	ctx, cancel := context.WithCancel(m.ctx)
	ran := make(chan error, 1)
	go func() { ran <- br.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("bridge: %v", err)
		}
	})
	m.waitFor("the bridge's queues", func() (bool, error) {
		select {
		case err := <-ran:
			ran <- err
			return false, fmt.Errorf("the bridge stopped: %v", err)
		default:
		}
		return br.Ready() == nil, nil
	})
	return f
}

// drainsWhileBridged asks the drain of the plan's old channel, from the
// fences of epoch, while the foreign producer still publishes there: it
// passes, the bridge carrying those messages to the new channel.
func (f *foreignProducer) drainsWhileBridged(t *testing.T, epoch int) {
	t.Helper()
	m := f.m
	ev := &migration.ReportEvidence{MaxAge: time.Minute}
	plan := migration.Plan{Name: "move", Old: m.oldChannel}
	m.waitFor("the drain to pass while the foreign producer publishes", func() (bool, error) {
		return ev.Drained(m.ctx, plan, m.consumer, epoch) == nil, nil
	})
	before := f.published.Load()
	m.waitFor("the foreign producer still publishing", func() (bool, error) { return f.published.Load() > before, nil })
}

// confirmChannel is a channel in confirm mode on the old RabbitMQ
// channel's broker, closed when the test ends.
func (m *liveMigration) confirmChannel() *amqp.Channel {
	m.t.Helper()
	rc := rabbitmq.Conn{URL: m.rabbitOld.URL, Password: m.rabbitOld.Password}
	conn, err := rc.Dial(rabbitNames)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		m.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		m.t.Fatal(err)
	}
	return ch
}

// stop ends the publishing and returns how many messages were published.
func (f *foreignProducer) stop(t *testing.T) int {
	t.Helper()
	f.stopOnce()
	if err := <-f.done; err != nil {
		t.Fatalf("foreign producer: %v", err)
	}
	return int(f.published.Load())
}

// check asserts what the bridge did: every foreign message applied once
// (the order is followsOnceAndInOrder's check, over every aggregate), some
// through the bridge's copies, Ferry's own messages not copied.
func (f *foreignProducer) check(t *testing.T, published int) {
	t.Helper()
	m := f.m
	if n := m.count(`SELECT count(DISTINCT message_id) FROM effects WHERE key LIKE 'foreign-%'`); n != published {
		t.Errorf("%d foreign messages applied, want the %d published", n, published)
	}
	st := f.bridge.Stats()
	t.Logf("bridge: %d copied, %d acknowledged by Kafka, %d derived ids, %d of Ferry's own skipped; foreign applied from the new channel %d",
		st.Consumed, st.Published, st.DerivedIDs, st.Skipped,
		m.count(`SELECT count(*) FROM effects WHERE key LIKE 'foreign-%' AND worker = '`+m.newTopic+`'`))
	if st.Published == 0 || st.DerivedIDs == 0 || st.Skipped == 0 {
		t.Errorf("bridge stats %+v: want copies, derived ids and Ferry's stamped messages skipped", st)
	}
	if n := m.count(`SELECT count(*) FROM effects WHERE key LIKE 'foreign-%' AND worker = '` + m.newTopic + `'`); n == 0 {
		t.Error("no foreign message applied from the bridge's copies on the new channel")
	}
	// No shadow of a bridged copy ever comes: one recorded as expecting
	// one would hold the shadow gate shut.
	if n := m.count(`SELECT count(*) FROM ferry_inbox_copy c WHERE NOT c.alone
		AND c.message_id IN (SELECT message_id FROM effects WHERE key LIKE 'foreign-%')`); n > 0 {
		t.Errorf("%d bridged copies recorded as waiting for a shadow", n)
	}
}

// A service that is not Ferry's keeps publishing to the old RabbitMQ
// channel through the whole migration to Kafka, with and without ids; a
// bridge started while the plan is OLD_ONLY copies its messages to the
// new topic. The worker applies each of them once, and each aggregate's in
// the order published, although it reads the old channel slowly: a copy
// waits for the old channel's fences, behind which lie the messages the
// bridge's queues never held.
func TestWorkerAppliesABridgedForeignProducerOnceAndInOrder(t *testing.T) {
	t.Parallel()
	m := setupLiveMigrationKinds(t, 5*time.Minute, migration.RabbitMQ, migration.Kafka)
	m.foreign = startForeign(t, m)
	followsOnceAndInOrder(t, m)
}
