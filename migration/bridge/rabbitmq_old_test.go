package bridge_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/payloadid"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/migration/bridge"
	"github.com/ferryhq/ferry/outbox"
)

const rabbitShards = 4

// rabbitBundle is a bundle whose plan's old channel is the stack's
// RabbitMQ: the bridge reads one exchange of it (b.oldTopic).
type rabbitBundle struct {
	*bundle
	conn *amqp.Connection
	pub  *amqp.Channel
}

func setupFromRabbitMQ(t *testing.T, newPartitions int32) *rabbitBundle {
	t.Helper()
	return setupFromRabbitMQTo(t, ferrytest.TopicB(t, newPartitions),
		migration.Channel{Brokers: ferrytest.BrokersB(t), TopicTemplate: "outbox.event.{aggregate_type}"})
}

// setupFromRabbitMQTo is setupFromRabbitMQ with the new channel newCh,
// the bridge copying to its topic newTopic.
func setupFromRabbitMQTo(t *testing.T, newTopic string, newCh migration.Channel) *rabbitBundle {
	t.Helper()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	b := &bundle{t: t, ctx: ctx, ctl: &migration.Controller{DB: db.Pool, Evidence: passing{}},
		plan: "bridge-" + ferrytest.Suffix(), logs: &ferrytest.Buffer{}}
	b.oldTopic = "outbox.bridge" + ferrytest.Suffix() + ".order"
	b.newTopic = newTopic
	url := os.Getenv(ferrytest.EnvRabbitMQURL)
	ferrytest.RabbitMQURL(t) // fails without the stack's RabbitMQ
	p := migration.Plan{
		Name: b.plan,
		Old: migration.Channel{Kind: migration.RabbitMQ, URL: url, PasswordEnv: ferrytest.EnvRabbitMQPassword,
			TopicTemplate: "outbox.bridge.{aggregate_type}", Shards: rabbitShards},
		New:    newCh,
		Groups: []string{"stock"},
	}
	if err := b.ctl.Create(ctx, p, "test"); err != nil {
		t.Fatal(err)
	}
	b.cfg = bridge.Config{
		Plan: b.plan, DB: db.Pool, Topics: []string{b.oldTopic}, TopicMap: map[string]string{b.oldTopic: b.newTopic},
		StepInterval: 50 * time.Millisecond,
		Logger:       slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	rb := &rabbitBundle{bundle: b, conn: conn, pub: ch}
	t.Cleanup(rb.cleanup)
	return rb
}

// cleanup deletes the bridge's queues and the exchange.
func (b *rabbitBundle) cleanup() {
	defer b.conn.Close()
	ch, err := b.conn.Channel()
	if err != nil {
		return
	}
	for s := range rabbitShards {
		_, _ = ch.QueueDelete(b.queue(s), false, false, false)
	}
	_, _ = ch.QueueDelete(b.oldTopic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
	_ = ch.ExchangeDelete(b.oldTopic+rabbitmq.DeadLetterExchangeSuffix, false, false)
	_ = ch.ExchangeDelete(b.oldTopic, false, false)
}

func (b *rabbitBundle) queue(shard int) string {
	return rabbitmq.QueueName(b.oldTopic, shard, bridge.GroupPrefix+b.plan)
}

// held is how many messages the bridge's queues hold, ready: with no
// bridge running, every message not acknowledged.
func (b *rabbitBundle) held() int {
	b.t.Helper()
	n := 0
	for s := range rabbitShards {
		q, ok, err := rabbitmq.Inspect(b.conn, b.queue(s))
		if err != nil || !ok {
			b.t.Fatalf("queue %s: exists %v, %v", b.queue(s), ok, err)
		}
		n += q.Messages
	}
	return n
}

// publish sends a foreign producer's messages to the exchange, each on
// its key's shard, and waits for the broker's confirms. idOf gives each
// message's id: a message id ("m:..."), an id header ("h:...") or none.
func (b *rabbitBundle) publish(recs []*kgo.Record, idOf func(i int) string) {
	b.t.Helper()
	for i, r := range recs {
		p := amqp.Publishing{Headers: amqp.Table{outbox.HeaderAggregateID: string(r.Key)}, Body: r.Value, DeliveryMode: amqp.Persistent}
		switch id := idOf(i); {
		case strings.HasPrefix(id, "m:"):
			p.MessageId = id
		case strings.HasPrefix(id, "h:"):
			p.Headers[outbox.HeaderID] = id
		}
		dc, err := b.pub.PublishWithDeferredConfirm(b.oldTopic, rabbitmq.RoutingKey(rabbitmq.Shard(r.Key, rabbitShards)), true, false, p)
		if err != nil {
			b.t.Fatal(err)
		}
		if !dc.Wait() {
			b.t.Fatalf("message %d nacked", i)
		}
	}
}

// noIDs gives no message an id.
func noIDs(int) string { return "" }

// Started while the plan is OLD_ONLY, the bridge declares its queues and
// copies nothing; from DUAL_WRITE on it copies each message with its id
// (message id, id header, or derived from exchange, routing key and body,
// the id a worker derives from the original), the aggregate as key, in
// each key's order, stamped authoritative and waiting for the old
// channel's fences of the session's epoch on the exchange.
func TestFromRabbitMQCopiesEachMessageWithItsID(t *testing.T) {
	t.Parallel()
	b := setupFromRabbitMQ(t, 3)
	r := b.start(b.cfg)
	b.waitFor("the bridge's queues", func() bool { return r.Ready() == nil })
	const keys, perKey = 6, 30
	recs := keyed(keys, perKey)
	idOf := func(i int) string {
		switch i % 3 {
		case 0:
			return "m:" + strconv.Itoa(i)
		case 1:
			return "h:" + strconv.Itoa(i)
		}
		return ""
	}
	b.publish(recs, idOf)
	if got := b.held(); got != keys*perKey {
		t.Fatalf("the bridge's queues hold %d messages while OLD_ONLY, want all %d", got, keys*perKey)
	}
	epoch := b.request(migration.DualWrite, 0)
	got := b.readB(keys * perKey)
	if dups := inKeyOrder(t, got, keys, perKey); dups != 0 {
		t.Errorf("%d duplicates in a run without failures", dups)
	}
	want := map[string]string{} // key/value -> id
	for i, rec := range recs {
		id := idOf(i) // the message id or the id header, as published
		if id == "" {
			id = payloadid.OfMessage(b.oldTopic, rabbitmq.RoutingKey(rabbitmq.Shard(rec.Key, rabbitShards)), rec.Value)
		}
		want[string(rec.Key)+"/"+string(rec.Value)] = id
	}
	for _, rec := range got {
		if ids, w := header(rec, outbox.HeaderID), want[string(rec.Key)+"/"+string(rec.Value)]; len(ids) != 1 || ids[0] != w {
			t.Fatalf("copy of %s/%s: ids %q, want %q", rec.Key, rec.Value, ids, w)
		}
		st := stamp(t, rec)
		if st.Role != route.Authoritative || st.Side != migration.NewSide || st.Since != epoch || st.Peer != b.oldTopic || st.Epoch != epoch ||
			!st.Bridged {
			t.Fatalf("copy of %s: stamp %+v, want bridged, authoritative on the new side since epoch %d, peer %s", rec.Key, st, epoch, b.oldTopic)
		}
		for _, h := range rec.Headers {
			if strings.HasPrefix(h.Key, "x-") || h.Key == rabbitmq.HeaderCreatedAt {
				t.Fatalf("copy of %s carries the broker's header %s", rec.Key, h.Key)
			}
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.DerivedIDs != keys*perKey/3 {
		t.Errorf("%d derived ids, want %d", st.DerivedIDs, keys*perKey/3)
	}
}

// A copy the new cluster refuses for good stops the bridge with a
// RefusedError naming the queue; the message and every later one of its
// queue stay unacknowledged there.
func TestFromRabbitMQARefusedCopyStaysInItsQueue(t *testing.T) {
	t.Parallel()
	b := setupFromRabbitMQ(t, 1)
	limit := "1024"
	small := "bridge.small." + ferrytest.Suffix()
	adm := ferrytest.AdminB(t)
	if res, err := adm.CreateTopic(b.ctx, 1, 1, map[string]*string{"max.message.bytes": &limit}, small); err != nil || res.Err != nil {
		t.Fatalf("create %s on B: %v %v", small, err, res.Err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), small) })
	b.newTopic = small
	cfg := b.cfg
	cfg.TopicMap = map[string]string{b.oldTopic: small}
	r := b.start(cfg)
	b.waitFor("the bridge's queues", func() bool { return r.Ready() == nil })
	b.request(migration.DualWrite, 0)

	const before = 5
	b.publish(keyed(1, before), noIDs)
	b.waitFor("the small copies published", func() bool { return r.Stats().Published == before })
	big := make([]byte, 4096) // random: compression cannot bring it under the limit
	_, _ = rand.Read(big)
	b.publish([]*kgo.Record{{Key: []byte("key-0"), Value: big}, {Key: []byte("key-0"), Value: []byte("after")}}, noIDs)

	var err error
	select {
	case err = <-r.done:
		r.done <- err
	case <-b.ctx.Done():
		t.Fatal("the bridge did not stop at the refused copy")
	}
	var refused *bridge.RefusedError
	queue := b.queue(rabbitmq.Shard([]byte("key-0"), rabbitShards))
	if !errors.As(err, &refused) || refused.Topic != b.oldTopic || refused.Queue != queue || refused.NewTopic != small {
		t.Fatalf("Run: %v, want a RefusedError for queue %s", err, queue)
	}
	if !strings.Contains(err.Error(), queue) {
		t.Errorf("error %q does not name the queue %s", err, queue)
	}
	// At least: RabbitMQ may also return messages whose acks were sent
	// just before the channel closed. A quorum queue takes back what a
	// closed channel held through its log, a moment after the close: the
	// count is waited for (read at once, it was 0 in a make test run).
	b.waitFor("the refused message and the one after it back in the bridge's queues", func() bool { return b.held() >= 2 })
}

// Stopped in the middle of a stream and started again, the bridge copies
// every message: what it had not acknowledged is delivered again, and
// copied again with the same id.
func TestFromRabbitMQStoppedMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	b := setupFromRabbitMQ(t, 3)
	b.request(migration.DualWrite, 0)
	// Refused: the plan left OLD_ONLY before the bridge's queues existed.
	first, err := bridge.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Run(b.ctx); !errors.Is(err, bridge.ErrLateQueues) || !strings.Contains(err.Error(), "OLD_ONLY") {
		t.Fatalf("Run after DUAL_WRITE without the bridge's queues: %v, want ErrLateQueues saying what to do", err)
	}
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclarePassive(b.queue(0), true, false, false, false, nil); err == nil {
		t.Fatal("a bridge refused for late queues declared them anyway")
	}
	b.request(migration.OldOnly, 0)
	slow := b.cfg
	slow.MaxInFlightRecords = 16 // so that it is stopped mid-stream
	r := b.start(slow)
	b.waitFor("the bridge's queues", func() bool { return r.Ready() == nil })
	const keys, perKey = 8, 250
	b.publish(keyed(keys, perKey), noIDs)
	b.request(migration.DualWrite, 0)
	b.waitFor("some copies published", func() bool { return r.Stats().Published >= 300 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	stopped := r.Stats().Published
	again := b.start(b.cfg)
	recs := b.readDistinct(keys * perKey)
	if err := again.stop(t); err != nil {
		t.Fatal(err)
	}
	dups := inKeyOrder(t, recs, keys, perKey)
	t.Logf("stopped after %d copies; %d copies in all, %d duplicates", stopped, len(recs), dups)
	if stopped >= keys*perKey {
		t.Fatalf("the first bridge copied all %d before it stopped: nothing tested", keys*perKey)
	}
}

// readDistinct reads the new topic from its start until it has n distinct
// keys and values, and returns every record read, in partition order.
func (b *rabbitBundle) readDistinct(n int) []*kgo.Record {
	b.t.Helper()
	cl := ferrytest.ClientB(b.t, kgo.ConsumeTopics(b.newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	seen := map[string]bool{}
	var out []*kgo.Record
	for len(seen) < n {
		f := cl.PollFetches(b.ctx)
		if b.ctx.Err() != nil {
			b.t.Fatalf("read %d distinct of %d records on B\nlogs:\n%s", len(seen), n, b.logs.String())
		}
		for _, r := range f.Records() {
			seen[string(r.Key)+"/"+string(r.Value)] = true
			out = append(out, r)
		}
	}
	return out
}

// toRabbitBundle is a bundle whose plan's new channel is the stack's
// RabbitMQ: the bridge copies b.oldTopic on cluster A to the exchange
// b.newTopic, for the group "stock".
type toRabbitBundle struct {
	*bundle
	conn *amqp.Connection
}

func setupToRabbitMQ(t *testing.T) *toRabbitBundle {
	t.Helper()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	b := &bundle{t: t, ctx: ctx, ctl: &migration.Controller{DB: db.Pool, Evidence: passing{}},
		plan: "bridge-" + ferrytest.Suffix(), oldTopic: ferrytest.Topic(t, 3), logs: &ferrytest.Buffer{}}
	b.newTopic = "outbox.bridge" + ferrytest.Suffix() + ".order"
	url := os.Getenv(ferrytest.EnvRabbitMQURL)
	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := migration.Plan{
		Name: b.plan,
		Old:  migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "outbox.event.{aggregate_type}"},
		New: migration.Channel{Kind: migration.RabbitMQ, URL: url, PasswordEnv: ferrytest.EnvRabbitMQPassword,
			TopicTemplate: "outbox.bridge.{aggregate_type}", Shards: rabbitShards},
		Groups: []string{"stock"},
	}
	if err := b.ctl.Create(ctx, p, "test"); err != nil {
		t.Fatal(err)
	}
	b.cfg = bridge.Config{
		Plan: b.plan, DB: db.Pool, Topics: []string{b.oldTopic}, TopicMap: map[string]string{b.oldTopic: b.newTopic},
		StepInterval: 50 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	rb := &toRabbitBundle{bundle: b, conn: conn}
	t.Cleanup(func() {
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for s := range rabbitShards {
			_, _ = ch.QueueDelete(rabbitmq.QueueName(b.newTopic, s, "stock"), false, false, false)
		}
		_, _ = ch.QueueDelete(b.newTopic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
		_ = ch.ExchangeDelete(b.newTopic+rabbitmq.DeadLetterExchangeSuffix, false, false)
		_ = ch.ExchangeDelete(b.newTopic, false, false)
	})
	return rb
}

// declare makes the group's shard queues on the new broker.
func (b *toRabbitBundle) declare() {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	defer ch.Close()
	if err := rabbitmq.Declare(ch, &rabbitmq.Topology{Consumer: "stock", Topics: []string{b.newTopic}, Shards: rabbitShards}); err != nil {
		b.t.Fatal(err)
	}
}

// take consumes n messages from the group's shard queues, each queue's
// in its order, as records (rabbitmq.Record).
func (b *toRabbitBundle) take(n int) []*kgo.Record {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	defer ch.Close()
	deliveries := make([]<-chan amqp.Delivery, rabbitShards)
	for s := range rabbitShards {
		if deliveries[s], err = ch.Consume(rabbitmq.QueueName(b.newTopic, s, "stock"), "", true, false, false, false, nil); err != nil {
			b.t.Fatal(err)
		}
	}
	var out []*kgo.Record
	b.waitFor(fmt.Sprintf("%d copies in the group's queues", n), func() bool {
		for s, c := range deliveries {
			for more := true; more; {
				select {
				case d := <-c:
					out = append(out, rabbitmq.Record(&d, b.newTopic, s))
				default:
					more = false
				}
			}
		}
		return len(out) >= n
	})
	return out
}

// From Kafka to RabbitMQ: while the plan's group has no queue on the new
// broker, the bridge holds its copies, says so in Ready, and commits no
// offset; once the queues exist, each record arrives in its key's shard
// queue in order, with its id (or the one derived from key and value),
// stamped authoritative, and the offsets are committed behind RabbitMQ's
// confirms.
func TestToRabbitMQHoldsUntilTheGroupsQueuesThenCopiesBehindConfirms(t *testing.T) {
	t.Parallel()
	b := setupToRabbitMQ(t)
	b.request(migration.DualWrite, 0)
	const keys, perKey = 6, 40
	recs := keyed(keys, perKey)
	for i, r := range recs {
		if i%2 == 0 {
			r.Headers = []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte("id-" + strconv.Itoa(i))}}
		}
	}
	b.produce(recs...)
	r := b.start(b.cfg)
	b.waitFor("the bridge to say it waits for the group's queues", func() bool {
		err := r.Ready()
		return err != nil && strings.Contains(err.Error(), `consumer "stock" has no queue`)
	})
	if got := b.committed(bridge.GroupPrefix + b.plan); got != 0 {
		t.Fatalf("committed %d offsets while no copy could be confirmed", got)
	}
	b.declare()
	got := b.take(keys * perKey)
	if dups := inKeyOrder(t, got, keys, perKey); dups != 0 {
		t.Errorf("%d duplicates in a run without failures", dups)
	}
	for _, rec := range got {
		ids := header(rec, outbox.HeaderID)
		want := payloadid.Of(rec.Key, rec.Value)
		for _, o := range recs {
			if string(o.Key) == string(rec.Key) && string(o.Value) == string(rec.Value) && len(o.Headers) > 0 {
				want = string(o.Headers[0].Value)
			}
		}
		if len(ids) != 1 || ids[0] != want {
			t.Fatalf("copy of %s/%s: ids %q, want %s", rec.Key, rec.Value, ids, want)
		}
		if st := stamp(t, rec); st.Role != route.Authoritative || st.Side != migration.NewSide || st.Since != 0 {
			t.Fatalf("copy of %s: stamp %+v, want authoritative on the new side", rec.Key, st)
		}
	}
	b.waitFor("every offset committed", func() bool { return b.committed(bridge.GroupPrefix+b.plan) == keys*perKey })
	if err := r.Ready(); err != nil {
		t.Errorf("Ready() = %v once the queues exist", err)
	}
}

// From RabbitMQ to RabbitMQ (another exchange template, here on the same
// node), the two parts the other tests prove each alone: the bridge's own
// queues on the old exchange, the group's on the new one. Each message
// arrives once in its key's shard queue there, in order, with its id and
// the bridged stamp, and its queue on the old broker ends empty.
func TestFromRabbitMQToRabbitMQCopiesEachMessageOnceInOrder(t *testing.T) {
	t.Parallel()
	newEx := "outbox.bridgeb" + ferrytest.Suffix() + ".order"
	b := setupFromRabbitMQTo(t, newEx, migration.Channel{Kind: migration.RabbitMQ, URL: os.Getenv(ferrytest.EnvRabbitMQURL),
		PasswordEnv: ferrytest.EnvRabbitMQPassword, TopicTemplate: "outbox.bridgeb.{aggregate_type}", Shards: rabbitShards})
	to := &toRabbitBundle{bundle: b.bundle, conn: b.conn}
	t.Cleanup(func() { deleteExchange(b.conn, newEx, "stock") })
	to.declare()
	r := b.start(b.cfg)
	b.waitFor("the bridge's queues", func() bool { return r.Ready() == nil })
	const keys, perKey = 5, 40
	recs := keyed(keys, perKey)
	idOf := func(i int) string {
		if i%2 == 0 {
			return "m:" + strconv.Itoa(i)
		}
		return ""
	}
	b.publish(recs, idOf)
	epoch := b.request(migration.DualWrite, 0)
	got := to.take(keys * perKey)
	if dups := inKeyOrder(t, got, keys, perKey); dups != 0 {
		t.Errorf("%d duplicates in a run without failures", dups)
	}
	for i, rec := range recs {
		id := idOf(i)
		if id == "" {
			id = payloadid.OfMessage(b.oldTopic, rabbitmq.RoutingKey(rabbitmq.Shard(rec.Key, rabbitShards)), rec.Value)
		}
		var copied *kgo.Record
		for _, c := range got {
			if string(c.Key) == string(rec.Key) && string(c.Value) == string(rec.Value) {
				copied = c
			}
		}
		if copied == nil {
			t.Fatalf("no copy of %s/%s", rec.Key, rec.Value)
		}
		if ids := header(copied, outbox.HeaderID); len(ids) != 1 || ids[0] != id {
			t.Fatalf("copy of %s/%s: ids %q, want %q", rec.Key, rec.Value, ids, id)
		}
		if st := stamp(t, copied); st.Role != route.Authoritative || st.Side != migration.NewSide || st.Since != epoch || !st.Bridged ||
			st.Peer != b.oldTopic {
			t.Fatalf("copy of %s: stamp %+v, want bridged, authoritative on the new side since epoch %d", rec.Key, st, epoch)
		}
	}
	b.waitFor("every message acknowledged on the old broker", func() bool { return b.held() == 0 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// deleteExchange deletes an exchange with consumer's shard queues and its
// dead-letter exchange and stream.
func deleteExchange(conn *amqp.Connection, exchange, consumer string) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	for s := range rabbitShards {
		_, _ = ch.QueueDelete(rabbitmq.QueueName(exchange, s, consumer), false, false, false)
	}
	_, _ = ch.QueueDelete(exchange+rabbitmq.DeadLetterStreamSuffix, false, false, false)
	_ = ch.ExchangeDelete(exchange+rabbitmq.DeadLetterExchangeSuffix, false, false)
	_ = ch.ExchangeDelete(exchange, false, false)
}
