package migration_test

import (
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration"
)

// DUAL_WRITE from Kafka towards RabbitMQ is rejected, and recorded with
// its reason, while a group of the plan lacks a shard queue on the new
// broker for a topic it consumes on the old channel (one it committed
// offsets on); once the group's queues are declared, it is accepted.
func TestDualWriteTowardsRabbitMQWaitsForTheGroupsQueues(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	suffix := ferrytest.Suffix()
	oldTopic, newTopic, group := "ctl."+suffix+".order", "outbox.ctl"+suffix+".order", "stock-"+suffix
	ferrytest.CreateTopic(t, oldTopic, 1)
	adm := kadm.NewClient(ferrytest.Client(t))
	var offsets kadm.Offsets
	offsets.Add(kadm.Offset{Topic: oldTopic, Partition: 0, At: 0, LeaderEpoch: -1})
	if _, err := adm.CommitOffsets(ctx, group, offsets); err != nil {
		t.Fatal(err)
	}
	p := migration.Plan{Name: "to-rabbit", Groups: []string{group},
		Old: migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "ctl." + suffix + ".{aggregate_type}"},
		New: migration.Channel{Kind: migration.RabbitMQ, URL: os.Getenv(ferrytest.EnvRabbitMQURL), PasswordEnv: ferrytest.EnvRabbitMQPassword,
			TopicTemplate: "outbox.ctl" + suffix + ".{aggregate_type}", Shards: 2}}
	c := &migration.Controller{DB: db.Pool}
	if err := c.Create(ctx, p, "test"); err != nil {
		t.Fatal(err)
	}
	d, err := c.Request(ctx, p.Name, migration.DualWrite, 0, "test")
	want := "group " + group + " has 2 of its 2 shard queues missing on the new channel (e.g. " + rabbitmq.QueueName(newTopic, 0, group) + ")"
	if err != nil || d.Accepted || !strings.Contains(d.Reason, want) {
		t.Fatalf("DUAL_WRITE with the group's queues missing: %+v, %v; want rejected saying %q", d, err, want)
	}
	h, err := c.History(ctx, p.Name)
	if err != nil || len(h) != 1 || h[0].Accepted || h[0].Reason != d.Reason {
		t.Fatalf("history %+v, %v: want the rejection recorded with its reason", h, err)
	}

	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := rabbitmq.Declare(ch, &rabbitmq.Topology{Consumer: group, Topics: []string{newTopic}, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for s := range 2 {
			_, _ = ch.QueueDelete(rabbitmq.QueueName(newTopic, s, group), false, false, false)
		}
		_, _ = ch.QueueDelete(newTopic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
		_ = ch.ExchangeDelete(newTopic, false, false)
		_ = ch.ExchangeDelete(newTopic+rabbitmq.DeadLetterExchangeSuffix, false, false)
	})
	if d, err := c.Request(ctx, p.Name, migration.DualWrite, 0, "test"); err != nil || !d.Accepted {
		t.Fatalf("DUAL_WRITE with the group's queues declared: %+v, %v; want accepted", d, err)
	}
}
