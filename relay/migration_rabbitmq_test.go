package relay_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/relay"
)

// setupMigrationToRabbitMQ is setupMigration with the stack's RabbitMQ as
// the new channel (16 shards, the relay's user, its password from the
// stack's variable) for groups; consumer "test"'s queues are declared.
func setupMigrationToRabbitMQ(t testing.TB, oldPartitions int32, groups ...string) *migrationBundle {
	t.Helper()
	b := setup(t)
	m := &migrationBundle{bundle: b, want: map[string]route.History{}}
	m.oldTopic = b.topic(t, "order", oldPartitions)
	newTemplate := "outbox." + ferrytest.Suffix() + ".{aggregate_type}"
	m.newTopic = strings.ReplaceAll(newTemplate, "{aggregate_type}", "order")
	declare(t, m.newTopic)
	m.ctl = &migration.Controller{DB: b.db.Pool, Evidence: passEvidence{}}
	m.plan = migration.Plan{
		Name: "move",
		Old:  migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: b.cfg.TopicTemplate},
		New: migration.Channel{Kind: migration.RabbitMQ, URL: need(t, ferrytest.EnvRabbitMQURL), PasswordEnv: ferrytest.EnvRabbitMQPassword,
			TopicTemplate: newTemplate, Shards: rabbitmq.ShardsDefault},
		Groups: groups,
	}
	if err := m.ctl.Create(b.ctx, m.plan, "test"); err != nil {
		t.Fatal(err)
	}
	m.history = route.History{{Plan: "move", Epoch: 0, Phase: migration.OldOnly}}
	return m
}

// From Kafka to RabbitMQ, through DUAL_WRITE, slice steps and a rollback:
// each event reaches the channels its step names, stamped as on Kafka,
// and each step's fences are on every partition of the old topic and on
// every shard queue of the new exchange, behind every event of the steps
// before and ahead of every event of the step. The slot is confirmed past
// the last event, which needs every copy's confirm.
func TestDualWriteToRabbitMQFencesEveryShard(t *testing.T) {
	t.Parallel()
	m := setupMigrationToRabbitMQ(t, 3, "test")
	r := m.start(t, m.cfg)

	m.writeBatch(t, 20)
	m.walk(t, 40,
		stepTo{migration.DualWrite, 0},
		stepTo{migration.Cutover, 64},
		stepTo{migration.DualWrite, 0}, // rollback
		stepTo{migration.Cutover, migration.Slices},
	)
	m.waitConfirmedPast(t, r, m.walPosition(t), "the last event")

	wantOld, wantNew := m.expected()
	oldRecs := readAll(t, ferrytest.Client(t, kgo.ConsumeTopics(m.oldTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantOld, time.Minute)
	newRecs := drainRabbit(t, m.newTopic)
	if n := newRecs.missing(wantNew); n > 0 {
		t.Fatalf("%d of the %d events routed to RabbitMQ are not in its queues, though the slot is confirmed past them", n, len(wantNew))
	}
	nOld := m.checkCopies(t, migration.OldSide, oldRecs)
	nNew := m.checkCopies(t, migration.NewSide, newRecs.records)
	m.checkFences(t, migration.OldSide, oldRecs, 3, []int{1, 2, 3, 4})
	m.checkFences(t, migration.NewSide, newRecs.records, rabbitmq.ShardsDefault, []int{1, 2, 3, 4})
	t.Logf("%d events, %d stamped copies on Kafka, %d on RabbitMQ", len(m.want), nOld, nNew)
}

// A copy never reaches one group's queue while another group of the plan
// has none: with group "billing"'s shard queues missing on the new
// broker, DUAL_WRITE's copies are held (nothing in group "test"'s
// queues), the relay is not ready and names the missing queue, and
// nothing is confirmed past the held copies; once billing's queues are
// declared, every copy reaches both groups' queues and the slot is
// confirmed past them.
func TestDualWriteToRabbitMQWaitsForEveryGroupsQueues(t *testing.T) {
	t.Parallel()
	m := setupMigrationToRabbitMQ(t, 1, "test", "billing")
	r := m.start(t, m.cfg)
	m.request(t, migration.DualWrite, 0)
	ids := m.writeBatch(t, 10)
	end := m.walPosition(t)
	waitReady(t, r, `consumer "billing" has no queue`)
	readAll(t, ferrytest.Client(t, kgo.ConsumeTopics(m.oldTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), ids, time.Minute)
	if got := drainRabbit(t, m.newTopic); len(got.records) > 0 {
		t.Fatalf("%d records reached group test's queues while group billing had none", len(got.records))
	}
	var past bool
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
		m.slot, end).Scan(&past); err != nil {
		t.Fatal(err)
	}
	if past {
		t.Fatalf("the slot is confirmed past %s, the held copies' end, before RabbitMQ took them", end)
	}

	ch, err := rabbitAdmin(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	billing := &rabbitmq.Topology{Consumer: "billing", Topics: []string{m.newTopic}, Shards: rabbitmq.ShardsDefault}
	if err := rabbitmq.Declare(ch, billing); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteTopology(t, "billing", false, m.newTopic) })
	m.waitConfirmedPast(t, r, end, "the copies held for billing's queues")
	waitReady(t, r, "")
	if got := drainRabbit(t, m.newTopic); got.missing(ids) > 0 {
		t.Fatalf("%d of %d copies missing from group test's queues once billing's were declared", got.missing(ids), len(ids))
	}
}

// From RabbitMQ to Kafka: the relay's own channel is RabbitMQ. Each step's
// fences are on every shard queue of the old exchange and on every
// partition of the new topic, between the events of the steps before and
// after, and every copy reaches the channels its step names.
func TestDualWriteFromRabbitMQFencesEveryShard(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	m := &migrationBundle{bundle: b, want: map[string]route.History{}}
	m.oldTopic = strings.ReplaceAll(b.cfg.TopicTemplate, "{aggregate_type}", "order")
	declare(t, m.oldTopic)
	newTemplate := "relayb." + ferrytest.Suffix() + ".{aggregate_type}"
	m.newTopic = strings.ReplaceAll(newTemplate, "{aggregate_type}", "order")
	ferrytest.CreateTopicB(t, m.newTopic, 4)
	m.ctl = &migration.Controller{DB: b.db.Pool, Evidence: passEvidence{}}
	m.plan = migration.Plan{
		Name: "move",
		Old: migration.Channel{Kind: migration.RabbitMQ, URL: need(t, ferrytest.EnvRabbitMQURL), PasswordEnv: ferrytest.EnvRabbitMQPassword,
			TopicTemplate: b.cfg.TopicTemplate, Shards: rabbitmq.ShardsDefault},
		New:    migration.Channel{Brokers: ferrytest.BrokersB(t), TopicTemplate: newTemplate},
		Groups: []string{"test"},
	}
	if err := m.ctl.Create(b.ctx, m.plan, "test"); err != nil {
		t.Fatal(err)
	}
	m.history = route.History{{Plan: "move", Epoch: 0, Phase: migration.OldOnly}}
	r := m.start(t, m.cfg)

	m.writeBatch(t, 20)
	m.walk(t, 40,
		stepTo{migration.DualWrite, 0},
		stepTo{migration.Cutover, 32},
		stepTo{migration.Cutover, migration.Slices},
	)
	m.waitConfirmedPast(t, r, m.walPosition(t), "the last event")

	wantOld, wantNew := m.expected()
	oldRecs := drainRabbit(t, m.oldTopic)
	if n := oldRecs.missing(wantOld); n > 0 {
		t.Fatalf("%d of the %d events routed to RabbitMQ are not in its queues, though the slot is confirmed past them", n, len(wantOld))
	}
	newRecs := readAll(t, ferrytest.ClientB(t, kgo.ConsumeTopics(m.newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantNew, time.Minute)
	nOld := m.checkCopies(t, migration.OldSide, oldRecs.records)
	nNew := m.checkCopies(t, migration.NewSide, newRecs)
	m.checkFences(t, migration.OldSide, oldRecs.records, rabbitmq.ShardsDefault, []int{1, 2, 3})
	m.checkFences(t, migration.NewSide, newRecs, 4, []int{1, 2, 3})
	t.Logf("%d events, %d stamped copies on RabbitMQ, %d on Kafka", len(m.want), nOld, nNew)
}

// A relay follows a plan only from its own channel: one whose old channel
// is of another kind, or of other shards, stops it with an error that
// names the mismatch (it would fence, and route, where its events are not).
func TestMigrationFromAnotherKindOfChannelIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		old  func(m *migrationBundle) migration.Channel
		want string
	}{
		{"kafka plan, rabbitmq relay", func(m *migrationBundle) migration.Channel {
			return migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: m.cfg.TopicTemplate}
		}, "leaves a kafka channel, but the relay writes rabbitmq"},
		{"other shards", func(m *migrationBundle) migration.Channel {
			return migration.Channel{Kind: migration.RabbitMQ, URL: need(t, ferrytest.EnvRabbitMQURL), TopicTemplate: m.cfg.TopicTemplate, Shards: 8}
		}, "a RabbitMQ channel of 8 shards, but the relay writes 16 (--rabbitmq-shards)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := &migrationBundle{bundle: rabbitSetup(t)}
			m.ctl = &migration.Controller{DB: m.db.Pool, Evidence: passEvidence{}}
			m.plan = migration.Plan{Name: "move", Old: tc.old(m),
				New: migration.Channel{Brokers: ferrytest.BrokersB(t), TopicTemplate: "relayb.{aggregate_type}"}, Groups: []string{"test"}}
			if err := m.ctl.Create(m.ctx, m.plan, "test"); err != nil {
				t.Fatal(err)
			}
			if err := relay.Setup(m.ctx, m.db.Pool, m.slot, m.cfg.Publication, nil); err != nil {
				t.Fatal(err)
			}
			m.request(t, migration.DualWrite, 0)
			r, err := relay.New(&m.cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = r.Run(m.ctx)
			if !errors.Is(err, relay.ErrFatal) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want a fatal error saying %q", err, tc.want)
			}
		})
	}
}
