package migration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
)

// evidence is what the consumer groups have reported, set by the test.
type evidence struct {
	mu      sync.Mutex
	gate    map[string]bool
	drained map[string]bool
}

func (e *evidence) ShadowGate(_ context.Context, _ migration.Plan, group string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.gate[group] {
		return errors.New("missing 3 events older than the allowed lateness")
	}
	return nil
}

func (e *evidence) Drained(_ context.Context, _ migration.Plan, group string, _ int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.drained[group] {
		return errors.New("lag 12 on the old channel")
	}
	return nil
}

func plan(name string) migration.Plan {
	return migration.Plan{
		Name:   name,
		Old:    migration.Channel{Brokers: []string{"a:9092"}, TopicTemplate: "outbox.event.{aggregate_type}"},
		New:    migration.Channel{Brokers: []string{"b:9092"}, TopicTemplate: "outbox.event.{aggregate_type}", SASLMechanism: "SCRAM-SHA-512", SASLUsername: "ferry", SASLPasswordEnv: "FERRY_NEW_SASL_PASSWORD"},
		Groups: []string{"stock", "billing"},
	}
}

// The phase machine, through every phase, slice steps, a rollback drill
// and the retirement: each request is recorded with who and whether it was
// accepted; forbidden and premature ones are rejected with their reason
// and change nothing; OLD_RETIRED is final.
func TestPhasesAcceptOnlyAllowedRequestsAndRecordEveryOne(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	ev := &evidence{gate: map[string]bool{}, drained: map[string]bool{}}
	c := &migration.Controller{DB: db.Pool, Evidence: ev}
	if err := c.Create(ctx, plan("move-1"), "ops@test"); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		to       migration.Phase
		slices   int
		before   func()
		accepted bool
		reason   string // part of the recorded reason
	}{
		{migration.Cutover, 6, nil, false, "forbidden: OLD_ONLY -> CUTOVER"},
		{migration.OldRetired, 0, nil, false, "forbidden"},
		{migration.DualWrite, 0, nil, true, "accepted"},
		{migration.DualWrite, 0, nil, false, "already"},
		{migration.Cutover, 6, nil, false, "shadow gate not passed: group stock"},
		{migration.Cutover, 6, func() { ev.gate["stock"] = true }, false, "group billing"},
		{migration.Cutover, 0, func() { ev.gate["billing"] = true }, false, "1 to 128 slices"},
		{migration.Cutover, 6, nil, true, "slices 0-5"},
		{migration.Cutover, 3, nil, false, "moves more slices"},
		{migration.OldRetired, 0, nil, false, "6 of 128 slices"},
		{migration.Cutover, 128, nil, true, "accepted"},
		{migration.OldRetired, 0, nil, false, "no rollback drill"},
		{migration.OldOnly, 0, nil, false, "forbidden: CUTOVER -> OLD_ONLY"},
		{migration.DualWrite, 0, nil, true, "rollback"},
		{migration.Cutover, 128, nil, true, "accepted"},
		{migration.OldRetired, 0, nil, false, "not drained: group stock: lag 12"},
		{migration.OldRetired, 0, func() { ev.drained["stock"], ev.drained["billing"] = true, true }, true, "new channel only"},
		{migration.DualWrite, 0, nil, false, "final"},
	}
	epoch := 0
	for i, s := range steps {
		if s.before != nil {
			s.before()
		}
		d, err := c.Request(ctx, "move-1", s.to, s.slices, "ops@test")
		if err != nil {
			t.Fatalf("step %d (%s %d): %v", i, s.to, s.slices, err)
		}
		if d.Accepted != s.accepted || !strings.Contains(d.Reason, s.reason) {
			t.Fatalf("step %d (%s %d): accepted %t, %q; want %t and %q", i, s.to, s.slices, d.Accepted, d.Reason, s.accepted, s.reason)
		}
		if s.accepted {
			epoch++
		}
		st, err := c.State(ctx, "move-1")
		if err != nil {
			t.Fatal(err)
		}
		if st.Epoch != epoch || (s.accepted && (st.Phase != s.to || st.Slices != s.slices)) {
			t.Fatalf("step %d: state %s %d epoch %d, want epoch %d (and %s %d if accepted)", i, st.Phase, st.Slices, st.Epoch, epoch, s.to, s.slices)
		}
	}
	hist, err := c.History(ctx, "move-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != len(steps) {
		t.Fatalf("%d requests recorded, want %d", len(hist), len(steps))
	}
	for i, h := range hist {
		if h.Accepted != steps[i].accepted || h.To != steps[i].to || h.By != "ops@test" || h.At.IsZero() || h.Reason == "" {
			t.Errorf("request %d recorded as %+v", i, h)
		}
	}
}

// Two operators asking at once: the requests are serialized, so exactly one
// moves OLD_ONLY to DUAL_WRITE and the other is recorded as rejected.
func TestConcurrentRequestsAreSerialized(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	c := &migration.Controller{DB: db.Pool, Evidence: &evidence{}}
	if err := c.Create(ctx, plan("move-2"), "ops@test"); err != nil {
		t.Fatal(err)
	}
	const n = 8
	results := make(chan *migration.Decision, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			d, err := c.Request(ctx, "move-2", migration.DualWrite, 0, "ops@test")
			if err != nil {
				t.Error(err)
				return
			}
			results <- d
		})
	}
	wg.Wait()
	close(results)
	accepted := 0
	for d := range results {
		if d.Accepted {
			accepted++
		}
	}
	if accepted != 1 {
		t.Fatalf("%d of %d concurrent DUAL_WRITE requests accepted, want 1", accepted, n)
	}
	if st, err := c.State(ctx, "move-2"); err != nil || st.Epoch != 1 {
		t.Fatalf("state %+v, %v; want epoch 1", st, err)
	}
}

// A relay follows one migration at a time: a second plan cannot start
// writing two channels while another one is in DUAL_WRITE or CUTOVER, and
// can once that one is abandoned.
func TestOneMigrationAtATime(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	c := &migration.Controller{DB: db.Pool, Evidence: &evidence{}}
	for _, name := range []string{"first", "second"} {
		if err := c.Create(ctx, plan(name), "ops@test"); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := c.Request(ctx, "first", migration.DualWrite, 0, "ops@test"); err != nil || !d.Accepted {
		t.Fatalf("first DUAL_WRITE: %+v, %v", d, err)
	}
	d, err := c.Request(ctx, "second", migration.DualWrite, 0, "ops@test")
	if err != nil {
		t.Fatal(err)
	}
	if d.Accepted || !strings.Contains(d.Reason, `plan "first" is in DUAL_WRITE`) {
		t.Fatalf("second DUAL_WRITE while the first migrates: %+v", d)
	}
	if d, err := c.Request(ctx, "first", migration.OldOnly, 0, "ops@test"); err != nil || !d.Accepted {
		t.Fatalf("abandon: %+v, %v", d, err)
	}
	if d, err := c.Request(ctx, "second", migration.DualWrite, 0, "ops@test"); err != nil || !d.Accepted {
		t.Fatalf("second DUAL_WRITE after the first was abandoned: %+v, %v", d, err)
	}
}

// rabbitChannel is a valid RabbitMQ channel.
func rabbitChannel() migration.Channel {
	return migration.Channel{Kind: migration.RabbitMQ, URL: "amqp://ferry@mq:5672/", PasswordEnv: "FERRY_NEW_RABBITMQ_PASSWORD",
		TopicTemplate: "outbox.event.{aggregate_type}", Shards: 16}
}

// Every combination of kinds makes a plan, read back as it was written;
// a channel recorded without a kind (before channels had one) is Kafka.
func TestPlansOfEitherKind(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	c := &migration.Controller{DB: db.Pool}
	kafka := plan("x").Old
	for i, tc := range []struct{ old, new migration.Channel }{
		{kafka, plan("x").New}, {kafka, rabbitChannel()}, {rabbitChannel(), kafka},
		{rabbitChannel(), func() migration.Channel { ch := rabbitChannel(); ch.URL = "amqps://ferry@mq2:5671/prod"; return ch }()},
	} {
		p := plan(fmt.Sprintf("kinds-%d", i))
		p.Old, p.New = tc.old, tc.new
		if err := c.Create(ctx, p, "ops@test"); err != nil {
			t.Fatalf("%s to %s: %v", tc.old.KindOf(), tc.new.KindOf(), err)
		}
		st, err := c.State(ctx, p.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(st.Plan.Old, p.Old) || !reflect.DeepEqual(st.Plan.New, p.New) {
			t.Errorf("%s to %s: read back %+v -> %+v, want %+v -> %+v", tc.old.KindOf(), tc.new.KindOf(), st.Plan.Old, st.Plan.New, p.Old, p.New)
		}
	}
	var legacy migration.Channel
	if err := json.Unmarshal([]byte(`{"brokers":["a:9092"],"topic_template":"t.{aggregate_type}"}`), &legacy); err != nil {
		t.Fatal(err)
	}
	if legacy.KindOf() != migration.Kafka {
		t.Fatalf("a channel without a kind is %q, want kafka", legacy.KindOf())
	}
}

// A plan is refused with the field at fault; a secret is never part of it.
func TestPlanValidation(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	c := &migration.Controller{DB: db.Pool}
	for _, tc := range []struct {
		mutate func(*migration.Plan)
		want   string
	}{
		{func(p *migration.Plan) { p.Name = "Move 1" }, "plan name"},
		{func(p *migration.Plan) { p.Old.Brokers = nil }, "old channel: no brokers"},
		{func(p *migration.Plan) { p.New.TopicTemplate = "" }, "new channel: no topic template"},
		{func(p *migration.Plan) { p.New.TopicTemplate = "x.dlq" }, "dead-letter"},
		// The templates relay.Config.TopicTemplate refuses, refused the same way.
		{func(p *migration.Plan) { p.New.TopicTemplate = "outbox.{aggregate_type" }, `new channel: topic template "outbox.{aggregate_type"`},
		{func(p *migration.Plan) { p.New.TopicTemplate = "outbox.{foo}" }, "unknown placeholder {foo}"},
		{func(p *migration.Plan) { p.Old.TopicTemplate = "outbox}.{aggregate_type}}" }, `old channel: topic template "outbox}.{aggregate_type}}"`},
		{func(p *migration.Plan) { p.New.TopicTemplate = "outbox event.{aggregate_type}" }, `new channel: topic template "outbox event.{aggregate_type}"`},
		{func(p *migration.Plan) { p.New = p.Old }, "the same"},
		{func(p *migration.Plan) { p.Groups = nil }, "Groups"},
		{func(p *migration.Plan) { p.New.SASLPasswordEnv = "hunter2!" }, "environment variable"},
		{func(p *migration.Plan) { p.New.SASLMechanism = "GSSAPI" }, "SASL mechanism"},
		{func(p *migration.Plan) { p.New.Kind = "nats" }, `new channel: kind "nats"`},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.Shards = 12 }, "new channel: shards: 12 is not a power of two"},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.Shards = 0 }, "new channel: shards: 0"},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.URL = "" }, "new channel url is empty"},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.URL = "http://mq:5672/" }, `new channel url: scheme "http"`},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.URL = "amqp://ferry:hunter2@mq:5672/" }, "carries a password"},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.PasswordEnv = "hunter2!" }, "password_env"},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.Brokers = []string{"b:9092"} }, "brokers, tls and sasl_* are Kafka settings"},
		{func(p *migration.Plan) { p.New = rabbitChannel(); p.New.TLS = true }, "uses TLS when its url is amqps://"},
		{func(p *migration.Plan) { p.New.Shards = 16 }, "url, password_env and shards are RabbitMQ settings"},
		{func(p *migration.Plan) { p.Old, p.New = rabbitChannel(), rabbitChannel() }, "the same"},
		{func(p *migration.Plan) {
			p.Old, p.New = rabbitChannel(), rabbitChannel()
			p.New.URL = "amqp://other@MQ:5672/%2F"
		}, "the same"},
	} {
		p := plan("move-3")
		tc.mutate(&p)
		if err := c.Create(ctx, p, "ops@test"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Create: %v, want an error naming %q", err, tc.want)
		}
	}
	if err := c.Create(ctx, plan("move-3"), "ops@test"); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, plan("move-3"), "ops@test"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second Create: %v, want an error saying it exists", err)
	}
	if _, err := c.Request(ctx, "nope", migration.DualWrite, 0, "ops@test"); !errors.Is(err, migration.ErrNotFound) {
		t.Fatalf("Request of an unknown plan: %v, want ErrNotFound", err)
	}
}
