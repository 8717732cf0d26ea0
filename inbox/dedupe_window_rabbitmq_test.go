package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/migration/bridge"
	"github.com/ferryhq/ferry/outbox"
)

// Seed 002's dedupe-window control across kinds. A producer that is not
// Ferry's publishes to the old RabbitMQ channel; a bridge copies its
// messages to the new Kafka channel, where the worker, following the
// migration, meets each one again and its inbox skips it. A prune between
// a message's two copies, with a retention below the cross-channel delay,
// forgets the first: the second then takes effect again.

const (
	// crossFirst messages pass through both channels before the prune, so
	// that the cross-channel delay can be measured by then.
	crossFirst = 40
	// crossSecond messages reach the new channel only after the prune.
	crossSecond = 120
	// crossRetention is the prune's retention: below the second
	// messages' delay, whose copies wait for the prune.
	crossRetention = 200 * time.Millisecond
)

// crossRun is what the scenario saw.
type crossRun struct {
	pruneErr error
	pruned   int64
	// doubles counts, by batch, the messages applied more than once.
	doubles map[string]int
}

// crossKindScenario runs the scenario, with Prune, or when unsafe with a
// prune that ignores the dedupe window (a plain DELETE at the retention):
//
//  1. The bridge declares its queues while the plan is OLD_ONLY and stops;
//     the plan goes to DUAL_WRITE and the worker learns the new channel.
//  2. The first messages go to the old exchange and are applied there.
//     The bridge runs and copies them; the worker meets them on the new
//     channel and skips them: pairs whose delay the prune can measure.
//  3. The bridge stops. The second messages are applied from the old
//     channel, their copies held in the bridge's queues.
//  4. Once every inbox row is older than crossRetention, the prune runs.
//  5. The bridge runs again and copies the second messages.
func crossKindScenario(t *testing.T, unsafe bool) crossRun {
	m := setupLiveMigrationKinds(t, 3*time.Minute, migration.RabbitMQ, migration.Kafka)
	m.startEffects(m.workerConfig())
	cleanup := &rbundle{rcfg: *m.rabbitOld, topic: m.oldTopic, consumer: bridge.GroupPrefix + "move"}
	t.Cleanup(cleanup.deleteTopology)
	cfg := &bridge.Config{Plan: "move", DB: m.db.Pool, Topics: []string{m.oldTopic},
		TopicMap: map[string]string{m.oldTopic: m.newTopic}, StepInterval: 50 * time.Millisecond, Logger: testLogger(t)}
	runBridge := func() (*bridge.Bridge, func()) {
		br, err := bridge.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(m.ctx)
		ran := make(chan error, 1)
		go func() { ran <- br.Run(ctx) }()
		return br, func() {
			cancel()
			if err := <-ran; err != nil {
				t.Errorf("bridge: %v", err)
			}
		}
	}

	// 1. The bridge's queues, then DUAL_WRITE and the fences it writes.
	br, stop := runBridge()
	m.waitFor("the bridge's queues", func() (bool, error) { return br.Ready() == nil, nil })
	stop()
	m.request(migration.DualWrite, 0)
	if _, err := outbox.Write(m.ctx, m.app, outbox.Event{AggregateType: "order", AggregateID: "ferry-1", EventType: "Changed",
		Payload: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	m.waitFor("the new channel learned", func() (bool, error) {
		return m.count(`SELECT count(*) FROM ferry_inbox_channel WHERE peer = $1`, m.newTopic) > 0, nil
	})

	pub := crossPublisher(t, m)
	effects := func(batch string) int {
		return m.count(`SELECT count(DISTINCT message_id) FROM effects WHERE message_id LIKE $1`, batch+"-%")
	}
	copiesOnNew := func(batch string) int {
		return m.count(`SELECT count(*) FROM ferry_inbox_copy WHERE consumer = $1 AND side = 'new' AND message_id LIKE $2`,
			m.consumer, batch+"-%")
	}

	// 2. The first messages, on the old channel, then their copies.
	pub("first", crossFirst)
	m.waitFor("the first messages applied from the old channel", func() (bool, error) { return effects("first") == crossFirst, nil })
	_, stop = runBridge()
	m.waitFor("the first messages' copies met on the new channel", func() (bool, error) { return copiesOnNew("first") == crossFirst, nil })
	if n := m.count(`SELECT count(*) FROM effects WHERE message_id LIKE 'first-%' AND worker = $1`, m.newTopic); n != 0 {
		t.Fatalf("%d first messages applied from their copies: the copies should come after the originals, the scenario proves nothing", n)
	}

	// 3. The second messages, on the old channel only.
	stop()
	pub("second", crossSecond)
	m.waitFor("the second messages applied from the old channel", func() (bool, error) { return effects("second") == crossSecond, nil })

	// 4. The prune, between the second messages' two copies.
	m.waitFor("every foreign inbox row older than the retention", func() (bool, error) {
		return m.count(`SELECT count(*) FROM inbox WHERE consumer = $1 AND processed_at < now() - $2::interval
			AND (message_id LIKE 'first-%' OR message_id LIKE 'second-%')`, m.consumer, crossRetention.String()) == crossFirst+crossSecond, nil
	})
	var run crossRun
	if unsafe {
		tag, err := m.db.Pool.Exec(m.ctx, `DELETE FROM inbox WHERE consumer = $1 AND processed_at < now() - $2::interval`,
			m.consumer, crossRetention.String())
		if err != nil {
			t.Fatal(err)
		}
		run.pruned = tag.RowsAffected()
	} else {
		res, err := Prune(m.ctx, m.db.Pool, &PruneConfig{InboxRetention: crossRetention, InboxRetentionMin: crossRetention})
		if res == nil {
			t.Fatalf("prune settings refused: %v", err)
		}
		run.pruneErr, run.pruned = err, res.Deleted
	}

	// 5. The second messages' late copies.
	_, stop = runBridge()
	defer stop()
	m.waitFor("the second messages' copies met on the new channel", func() (bool, error) { return copiesOnNew("second") == crossSecond, nil })
	// A copy counts once its transaction committed: the effects are in.
	run.doubles = map[string]int{}
	rows, err := m.db.Pool.Query(m.ctx, `SELECT split_part(message_id, '-', 1) FROM effects GROUP BY message_id HAVING count(*) > 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var batch string
		if err := rows.Scan(&batch); err != nil {
			t.Fatal(err)
		}
		run.doubles[batch]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d + %d foreign messages; retention %s; prune deleted %d inbox rows, error: %v; doubles by batch %v",
		crossFirst, crossSecond, crossRetention, run.pruned, run.pruneErr, run.doubles)
	return run
}

// crossPublisher returns a function that publishes n messages of batch to
// the old exchange as a producer that is not Ferry's, each with a message
// id of its own, and waits for the broker's confirms.
func crossPublisher(t *testing.T, m *liveMigration) func(batch string, n int) {
	t.Helper()
	ch := m.confirmChannel()
	return func(batch string, n int) {
		t.Helper()
		for i := range n {
			key := fmt.Sprintf("foreign-%s-%d", batch, i)
			dc, err := ch.PublishWithDeferredConfirm(m.oldTopic, rabbitmq.RoutingKey(rabbitmq.Shard([]byte(key), m.rabbitOld.Shards)), true, false,
				amqp.Publishing{MessageId: batch + "-" + strconv.Itoa(i), Headers: amqp.Table{outbox.HeaderAggregateID: key},
					Body: []byte("1"), DeliveryMode: amqp.Persistent})
			if err != nil {
				t.Fatal(err)
			}
			if !dc.Wait() {
				t.Fatalf("message %s-%d nacked", batch, i)
			}
		}
	}
}

// The negative control across kinds: a prune that ignores the dedupe
// window forgets the second messages while their bridged copies are still
// to come, and each of them takes effect twice.
func TestDedupeWindowShorterThanTheRabbitMQToKafkaDelayAppliesTwice(t *testing.T) {
	t.Parallel()
	run := crossKindScenario(t, true)
	if run.doubles["second"] != crossSecond {
		t.Fatalf("double effects by batch %v, want each of the %d second messages twice (pruned before their copy came)", run.doubles, crossSecond)
	}
}

// The same with the dedupe window checked: the prune refuses the
// consumer, whose measured cross-channel delay needs a retention of an
// hour or more, and every message has one effect.
func TestDedupeWindowCheckedAgainstTheRabbitMQToKafkaDelayAppliesOnce(t *testing.T) {
	t.Parallel()
	run := crossKindScenario(t, false)
	var dw *DedupeWindowError
	if !errors.Is(run.pruneErr, ErrRetentionTooShort) || !errors.As(run.pruneErr, &dw) {
		t.Errorf("prune at %s: %v, want a *DedupeWindowError wrapping ErrRetentionTooShort", crossRetention, run.pruneErr)
	} else {
		t.Logf("the prune refused: the largest cross-channel delay measured was %s", dw.Delay)
	}
	if run.pruned != 0 {
		t.Errorf("the prune deleted %d inbox rows, want none", run.pruned)
	}
	if len(run.doubles) > 0 {
		t.Errorf("double effects by batch %v, want every message once", run.doubles)
	}
}
