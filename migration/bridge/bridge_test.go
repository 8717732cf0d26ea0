package bridge_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/payloadid"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/migration/bridge"
	"github.com/ferryhq/ferry/outbox"
)

// passing is Evidence that lets every change through.
type passing struct{}

func (passing) ShadowGate(context.Context, migration.Plan, string) error   { return nil }
func (passing) Drained(context.Context, migration.Plan, string, int) error { return nil }

// bundle is what a bridge test needs: a plan from cluster A to cluster B
// in its own database, a topic on each side, and the bridge's settings.
type bundle struct {
	t        *testing.T
	ctx      context.Context
	ctl      *migration.Controller
	plan     string
	oldTopic string // on cluster A
	newTopic string // on cluster B
	cfg      bridge.Config
	logs     *ferrytest.Buffer
}

type opts struct {
	oldPartitions, newPartitions int32
	newBrokers                   []string // default: cluster B
}

func setup(t *testing.T, o opts) *bundle {
	t.Helper()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	b := &bundle{t: t, ctx: ctx, ctl: &migration.Controller{DB: db.Pool, Evidence: passing{}},
		plan: "bridge-" + ferrytest.Suffix(), oldTopic: ferrytest.Topic(t, cmpOr(o.oldPartitions, 3)), logs: &ferrytest.Buffer{}}
	newBrokers := o.newBrokers
	if newBrokers == nil {
		newBrokers = ferrytest.BrokersB(t)
		b.newTopic = ferrytest.TopicB(t, cmpOr(o.newPartitions, 2))
	} else {
		b.newTopic = b.oldTopic + ".new"
	}
	p := migration.Plan{
		Name:   b.plan,
		Old:    migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "outbox.event.{aggregate_type}"},
		New:    migration.Channel{Brokers: newBrokers, TopicTemplate: "outbox.event.{aggregate_type}"},
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
	return b
}

func cmpOr(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
}

// request moves the plan, and fails the test if the controller refuses.
func (b *bundle) request(to migration.Phase, slices int) int {
	b.t.Helper()
	d, err := b.ctl.Request(b.ctx, b.plan, to, slices, "test")
	if err != nil || !d.Accepted {
		b.t.Fatalf("request %s %d: %+v, %v", to, slices, d, err)
	}
	return d.Epoch
}

// running is a bridge started in the background.
type running struct {
	*bridge.Bridge
	cancel context.CancelFunc
	done   chan error
}

func (b *bundle) start(cfg bridge.Config) *running {
	b.t.Helper()
	br, err := bridge.New(&cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	r := &running{Bridge: br, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- br.Run(ctx) }()
	b.t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// stop cancels the bridge and returns what Run returned.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(time.Minute):
		t.Fatal("the bridge did not stop within a minute of its context's end")
		return nil
	}
}

// waitFor polls cond until it holds, or fails the test at the deadline.
func (b *bundle) waitFor(what string, cond func() bool) {
	b.t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("timed out waiting for %s\nlogs:\n%s", what, b.logs.String())
		case <-tick.C:
		}
	}
}

// produce writes records to the old topic on cluster A, in order.
func (b *bundle) produce(recs ...*kgo.Record) {
	b.t.Helper()
	for _, r := range recs {
		r.Topic = b.oldTopic
	}
	if err := ferrytest.Client(b.t).ProduceSync(b.ctx, recs...).FirstErr(); err != nil {
		b.t.Fatal(err)
	}
}

// onB is how many records the new topic on cluster B holds.
func (b *bundle) onB() int64 {
	b.t.Helper()
	ends, err := ferrytest.AdminB(b.t).ListEndOffsets(b.ctx, b.newTopic)
	if err != nil {
		b.t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// readB reads the new topic from its start until it has n records (in
// partition order, the order a consumer sees).
func (b *bundle) readB(n int) []*kgo.Record {
	b.t.Helper()
	b.waitFor(fmt.Sprintf("%d records on cluster B", n), func() bool { return b.onB() >= int64(n) })
	cl := ferrytest.ClientB(b.t, kgo.ConsumeTopics(b.newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	for len(out) < n {
		f := cl.PollFetches(b.ctx)
		if b.ctx.Err() != nil {
			b.t.Fatalf("read %d of %d records on B", len(out), n)
		}
		out = append(out, f.Records()...)
	}
	return out
}

// committed is the sum of the offsets the group committed on cluster A.
func (b *bundle) committed(group string) int64 {
	b.t.Helper()
	offs, err := ferrytest.Admin(b.t).FetchOffsets(b.ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return 0
	}
	if err != nil {
		b.t.Fatal(err)
	}
	var n int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At > 0 {
			n += o.At
		}
	})
	return n
}

func header(r *kgo.Record, key string) []string {
	var out []string
	for _, h := range r.Headers {
		if h.Key == key {
			out = append(out, string(h.Value))
		}
	}
	return out
}

// stamp is the copy's one route stamp.
func stamp(t *testing.T, r *kgo.Record) route.Stamp {
	t.Helper()
	vs := header(r, route.HeaderRoute)
	if len(vs) != 1 {
		t.Fatalf("record %s has %d route stamps, want 1: %q", r.Key, len(vs), vs)
	}
	st, err := route.ParseStamp(vs[0])
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Records with an id header keep it, records without one get the id
// derived from key and value, and a second run from the start (another
// group) gives every record the same id again. A forged route stamp is
// replaced. The group's offsets are committed once B acknowledged.
func TestIDsArePreservedOrDerivedAndStableAcrossRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	b.request(migration.DualWrite, 0)
	const n = 40
	var recs []*kgo.Record
	for i := range n {
		r := &kgo.Record{Key: []byte("k" + strconv.Itoa(i%7)), Value: []byte("v" + strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t" + strconv.Itoa(i))}}}
		if i%2 == 0 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderID, Value: []byte("evt-" + strconv.Itoa(i))})
		}
		if i%5 == 0 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: route.HeaderRoute, Value: []byte("plan=forged;epoch=99;slice=0;side=new;role=authoritative")})
		}
		recs = append(recs, r)
	}
	b.produce(recs...)

	first := b.start(b.cfg)
	b.waitFor("the first run to publish every record", func() bool { return first.Stats().Published == n })
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	if st := first.Stats(); st.DerivedIDs != n/2 || st.Consumed != n {
		t.Fatalf("first run: %+v, want %d consumed, %d derived ids", st, n, n/2)
	}
	if got := b.committed(bridge.GroupPrefix + b.plan); got != n {
		t.Fatalf("the bridge's group committed %d offsets after B acknowledged %d records", got, n)
	}

	replay := b.cfg
	replay.Group = "replay-" + ferrytest.Suffix()
	second := b.start(replay)
	b.waitFor("the replay to publish every record", func() bool { return second.Stats().Published == n })
	if err := second.stop(t); err != nil {
		t.Fatal(err)
	}

	ids := map[string][]string{} // value -> the id of each copy
	for _, r := range b.readB(2 * n) {
		id := header(r, outbox.HeaderID)
		if len(id) != 1 {
			t.Fatalf("copy of %s has ids %q, want one", r.Value, id)
		}
		if st := stamp(t, r); st.Plan != b.plan || st.Epoch != 1 || st.Side != migration.NewSide || st.Role != route.Authoritative || st.Slice != route.Slice(r.Key) {
			t.Fatalf("copy of %s: stamp %+v, want plan %s epoch 1 new authoritative slice %d", r.Value, st, b.plan, route.Slice(r.Key))
		}
		i, _ := strconv.Atoi(strings.TrimPrefix(string(r.Value), "v"))
		if got := header(r, "trace"); !slices.Equal(got, []string{"t" + strconv.Itoa(i)}) {
			t.Fatalf("copy of %s: trace header %q", r.Value, got)
		}
		want := payloadid.Of(r.Key, r.Value)
		if i%2 == 0 {
			want = "evt-" + strconv.Itoa(i)
		}
		if id[0] != want {
			t.Fatalf("copy of %s has id %s, want %s", r.Value, id[0], want)
		}
		ids[string(r.Value)] = append(ids[string(r.Value)], id[0])
	}
	for v, got := range ids {
		if len(got) != 2 || got[0] != got[1] {
			t.Fatalf("record %s: ids %q over two runs, want the same id twice", v, got)
		}
	}
	if len(ids) != n {
		t.Fatalf("%d distinct records on B, want %d", len(ids), n)
	}
}

// inKeyOrder checks that each key's values, duplicates dropped (the first
// copy kept), are 0, 1, 2, ... in the order read, and that each key sits
// in one partition of B. It returns how many copies were duplicates.
func inKeyOrder(t *testing.T, recs []*kgo.Record, keys, perKey int) int {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	part := map[string]int32{}
	dups := 0
	for _, r := range recs {
		k := string(r.Key)
		if p, ok := part[k]; ok && p != r.Partition {
			t.Fatalf("key %s is in partitions %d and %d of B", k, p, r.Partition)
		}
		part[k] = r.Partition
		if seen[k+"/"+string(r.Value)] {
			dups++
			continue
		}
		seen[k+"/"+string(r.Value)] = true
		if want := strconv.Itoa(next[k]); string(r.Value) != want {
			t.Fatalf("key %s: value %s arrived where %s was due: order broken", k, r.Value, want)
		}
		next[k]++
	}
	if len(next) != keys {
		t.Fatalf("%d keys on B, want %d", len(next), keys)
	}
	for k, n := range next {
		if n != perKey {
			t.Fatalf("key %s: %d distinct values on B, want %d", k, n, perKey)
		}
	}
	return dups
}

func keyed(keys, perKey int) []*kgo.Record {
	var recs []*kgo.Record
	for i := range perKey {
		for k := range keys {
			recs = append(recs, &kgo.Record{Key: []byte("key-" + strconv.Itoa(k)), Value: []byte(strconv.Itoa(i))})
		}
	}
	return recs
}

// From 4 partitions on A to 3 on B, through a small in-flight window: each
// key's records arrive on B in their order, in one partition.
func TestPerKeyOrderIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{oldPartitions: 4, newPartitions: 3})
	b.request(migration.DualWrite, 0)
	const keys, perKey = 12, 100
	b.produce(keyed(keys, perKey)...)
	cfg := b.cfg
	cfg.MaxInFlightRecords = 7
	r := b.start(cfg)
	b.waitFor("every record published", func() bool { return r.Stats().Published == keys*perKey })
	if dups := inKeyOrder(t, b.readB(keys*perKey), keys, perKey); dups != 0 {
		t.Errorf("%d duplicates in a run without failures", dups)
	}
}

// With the new cluster unreachable, the bridge reads every record and
// sends it, and commits nothing: no offset before B's acknowledgement, not
// even at shutdown.
func TestNoOffsetIsCommittedWithoutTheNewClustersAck(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{newBrokers: []string{"127.0.0.1:1"}})
	b.request(migration.DualWrite, 0)
	const n = 30
	b.produce(keyed(3, n/3)...)
	cfg := b.cfg
	cfg.ShutdownTimeout = 500 * time.Millisecond
	r := b.start(cfg)
	b.waitFor("every record read and sent", func() bool { return r.Stats().Consumed == n })
	// Several commit rounds pass while the records wait for B.
	for range 3 {
		reads := r.Stats().StepReads
		b.waitFor("another step read", func() bool { return r.Stats().StepReads > reads+2 })
		if got := b.committed(bridge.GroupPrefix + b.plan); got != 0 {
			t.Fatalf("the group committed %d offsets while B acknowledged nothing", got)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := b.committed(bridge.GroupPrefix + b.plan); got != 0 {
		t.Fatalf("the group committed %d offsets at shutdown, with nothing acknowledged", got)
	}
	if st := r.Stats(); st.Published != 0 || st.Commits != 0 {
		t.Fatalf("stats %+v: published or committed without an ack", st)
	}
}

// A bridge stopped while records flow, abandoning its copies in flight,
// and started again: every record ends on B, in key order; duplicates are
// allowed, and carry the same id.
func TestStoppedMidStreamAndRestartedLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{oldPartitions: 3, newPartitions: 2})
	b.request(migration.DualWrite, 0)
	const keys, perKey = 20, 150
	recs := keyed(keys, perKey)
	var producing sync.WaitGroup
	producing.Go(func() {
		for i := 0; i < len(recs); i += 100 {
			b.produce(recs[i:min(i+100, len(recs))]...)
		}
	})
	cfg := b.cfg
	cfg.MaxInFlightRecords = 300
	// The producer sends a batch only once it is full (2 KiB, about ten
	// copies) and holds a partial one for a minute; stopping does not wait
	// for them: the stop abandons the copies of the partial batches, which
	// B never saw, as a crash would. A linger the stop could outlast (300ms
	// was, under -race on a busy machine) let everything out first.
	cfg.NewKafkaOpts = []kgo.Opt{kgo.ProducerLinger(time.Minute), kgo.ProducerBatchMaxBytes(2 << 10)}
	cfg.ShutdownTimeout = time.Millisecond
	// A full batch's request also carries the other partition's partial
	// one, so a bridge caught up with A can have everything out at the
	// instant it stops (a run under -race in make test did): such a stop
	// abandons nothing, and the bridge is started and stopped again, from
	// what it committed, until one does.
	for run := 1; ; run++ {
		first := b.start(cfg)
		b.waitFor("a first part published and more waiting", func() bool {
			st := first.Stats()
			return st.Published >= 400 && st.Consumed > st.Published
		})
		if err := first.stop(t); err != nil {
			t.Fatal(err)
		}
		st := first.Stats()
		t.Logf("stopped run %d: consumed %d, published %d", run, st.Consumed, st.Published)
		if st.Consumed > st.Published {
			break
		}
		if run == 3 {
			t.Fatal("three stops abandoned no copy: the test proves nothing")
		}
	}
	producing.Wait()

	b.start(b.cfg)
	b.waitFor("the second run to commit every record", func() bool { return b.committed(bridge.GroupPrefix+b.plan) == keys*perKey })
	onB := int(b.onB())
	got := b.readB(onB)
	dups := inKeyOrder(t, got, keys, perKey)
	t.Logf("%d records, %d on B, %d duplicates", keys*perKey, onB, dups)
	ids := map[string]string{}
	for _, r := range got {
		id := header(r, outbox.HeaderID)
		if len(id) != 1 || id[0] != payloadid.Of(r.Key, r.Value) {
			t.Fatalf("copy %s/%s: id %q", r.Key, r.Value, id)
		}
		ids[string(r.Key)+"/"+string(r.Value)] = id[0]
	}
	if len(ids) != keys*perKey {
		t.Fatalf("%d distinct records on B, want %d", len(ids), keys*perKey)
	}
}

// Each copy's stamp carries the epoch of the step the bridge read and its
// key's slice, and says authoritative in DUAL_WRITE and in CUTOVER, for
// moved and unmoved slices alike (see the package doc: bridged copies are
// applied on sight).
func TestStampsFollowThePlanPerSlice(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	dual := b.request(migration.DualWrite, 0)
	r := b.start(b.cfg)
	const keys = 200
	batch := func(tag string) []*kgo.Record {
		var recs []*kgo.Record
		for k := range keys {
			recs = append(recs, &kgo.Record{Key: []byte("agg-" + strconv.Itoa(k)), Value: []byte(tag)})
		}
		return recs
	}
	b.produce(batch("before")...)
	b.waitFor("the DUAL_WRITE batch published", func() bool { return r.Stats().Published == keys })

	const moved = 64
	cut := b.request(migration.Cutover, moved)
	b.waitFor("the bridge to read the CUTOVER step", func() bool { return r.Stats().Epoch == cut })
	b.produce(batch("after")...)

	movedKeys := 0
	for _, rec := range b.readB(2 * keys) {
		st := stamp(t, rec)
		slice := route.Slice(rec.Key)
		want := route.Stamp{Plan: b.plan, Epoch: dual, Slice: slice, Side: migration.NewSide, Role: route.Authoritative}
		if string(rec.Value) == "after" {
			want.Epoch = cut
			if slice < moved {
				movedKeys++
			}
		}
		if st != want {
			t.Fatalf("%s copy of %s (slice %d): stamp %+v, want %+v", rec.Value, rec.Key, slice, st, want)
		}
	}
	if movedKeys == 0 || movedKeys == keys {
		t.Fatalf("%d of %d keys in moved slices: the keys should cover moved and unmoved slices", movedKeys, keys)
	}
}

// While the plan is OLD_ONLY the bridge publishes nothing and commits
// nothing, and says so once; once the plan is in DUAL_WRITE it copies
// what was waiting, stamped with the DUAL_WRITE step.
func TestOldOnlyPublishesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	const n = 20
	b.produce(keyed(4, n/4)...)
	r := b.start(b.cfg)
	b.waitFor("several reads of the OLD_ONLY step", func() bool { return r.Stats().StepReads >= 5 })
	if st := r.Stats(); !st.Waiting || st.Consumed != 0 || st.Published != 0 {
		t.Fatalf("stats in OLD_ONLY: %+v", st)
	}
	if got := b.onB(); got != 0 {
		t.Fatalf("%d records on B while the plan is OLD_ONLY", got)
	}
	if got := b.committed(bridge.GroupPrefix + b.plan); got != 0 {
		t.Fatalf("%d offsets committed while the plan is OLD_ONLY", got)
	}
	if got := strings.Count(b.logs.String(), "the plan is OLD_ONLY"); got != 1 {
		t.Fatalf("the waiting is logged %d times, want once:\n%s", got, b.logs.String())
	}

	epoch := b.request(migration.DualWrite, 0)
	for _, rec := range b.readB(n) {
		if st := stamp(t, rec); st.Epoch != epoch || st.Role != route.Authoritative {
			t.Fatalf("copy stamped %+v, want epoch %d authoritative", st, epoch)
		}
	}
	b.waitFor("the copies committed", func() bool { return b.committed(bridge.GroupPrefix+b.plan) == n })
}

// A record the new cluster refuses for good stops the bridge with an error
// naming its topic, partition and offset; the records before it are
// committed, it is not, and a restart stops at it again.
func TestARefusedRecordStopsTheBridge(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{oldPartitions: 1})
	b.request(migration.DualWrite, 0)
	// A topic of its own on B that takes small records only.
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

	const before = 5
	b.produce(keyed(1, before)...)
	r := b.start(cfg)
	b.waitFor("the small records published", func() bool { return r.Stats().Published == before })
	big := make([]byte, 4096) // random: compression cannot bring it under the limit
	_, _ = rand.Read(big)
	b.produce(&kgo.Record{Key: []byte("key-0"), Value: big}, &kgo.Record{Key: []byte("key-0"), Value: []byte("after")})

	var err error
	select {
	case err = <-r.done:
		r.done <- err
	case <-b.ctx.Done():
		t.Fatal("the bridge did not stop at the refused record")
	}
	var refused *bridge.RefusedError
	if !errors.As(err, &refused) || refused.Topic != b.oldTopic || refused.Partition != 0 || refused.Offset != before || refused.NewTopic != small {
		t.Fatalf("Run: %v, want a RefusedError for %s partition 0 offset %d", err, b.oldTopic, before)
	}
	for _, want := range []string{b.oldTopic, "partition 0", "offset " + strconv.Itoa(before)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if got := b.committed(bridge.GroupPrefix + b.plan); got != before {
		t.Fatalf("committed offset %d, want %d: up to the refused record, not past it", got, before)
	}
	again := b.start(cfg)
	select {
	case err = <-again.done:
		again.done <- err
	case <-b.ctx.Done():
		t.Fatal("the restarted bridge did not stop at the refused record")
	}
	if !errors.As(err, &refused) || refused.Offset != before {
		t.Fatalf("restart: %v, want the same refusal at offset %d", err, before)
	}
}

// A plan that does not exist is an error naming Config.Plan; on a plan
// whose channels are one cluster, a copy onto a topic the bridge reads is
// refused before anything is read.
func TestPlanProblemsStopTheBridgeAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	cfg := b.cfg
	cfg.Plan = "no-such-plan"
	br, err := bridge.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Run(b.ctx); !errors.Is(err, migration.ErrNotFound) || !strings.Contains(err.Error(), "Config.Plan") {
		t.Fatalf("Run: %v, want ErrNotFound naming Config.Plan", err)
	}

	same := b.plan + "-same"
	if err := b.ctl.Create(b.ctx, migration.Plan{Name: same,
		Old:    migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "outbox.event.{aggregate_type}"},
		New:    migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "v2.outbox.event.{aggregate_type}"},
		Groups: []string{"stock"}}, "test"); err != nil {
		t.Fatal(err)
	}
	cfg = b.cfg
	cfg.Plan, cfg.TopicMap = same, nil
	if br, err = bridge.New(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := br.Run(b.ctx); !errors.Is(err, bridge.ErrTopicLoop) || !strings.Contains(err.Error(), "Config.TopicTemplate") {
		t.Fatalf("Run: %v, want ErrTopicLoop naming Config.TopicTemplate", err)
	}
}

// A regular expression copies every topic whose whole name it matches, and
// no other.
func TestTopicRegexCopiesMatchingTopicsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	b.request(migration.DualWrite, 0)
	prefix := "bridge.rx." + ferrytest.Suffix()
	a, other := prefix+".a", prefix+"x.b" // other shares the prefix, not the pattern
	ferrytest.CreateTopic(t, a, 2)
	ferrytest.CreateTopic(t, other, 2)
	cl := ferrytest.Client(t)
	for i := range 10 {
		for _, topic := range []string{b.oldTopic, a, other} {
			if err := cl.ProduceSync(b.ctx, &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i)), Value: []byte(topic)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	newA := ferrytest.TopicB(t, 1)
	cfg := b.cfg
	cfg.TopicRegex = regexp.QuoteMeta(prefix) + `\.[a-z]`
	cfg.TopicMap = map[string]string{b.oldTopic: b.newTopic, a: newA}
	r := b.start(cfg)
	b.waitFor("both matched topics copied", func() bool { return r.Stats().Published >= 20 })
	for _, rec := range b.readB(10) {
		if string(rec.Value) != b.oldTopic {
			t.Fatalf("%s holds a record of %s", b.newTopic, rec.Value)
		}
	}
	b.newTopic = newA
	for _, rec := range b.readB(10) {
		if string(rec.Value) != a {
			t.Fatalf("%s holds a record of %s", newA, rec.Value)
		}
	}
	// Stop, so that everything the bridge read is counted.
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Consumed != 20 {
		t.Fatalf("consumed %d records, want the 20 of the two topics (not those of %s)", st.Consumed, other)
	}
}

// Two bridges in one group share the partitions: the rebalance moves
// partitions from the first to the second, the first commits what B
// acknowledged before it lets them go, and every record ends on B in key
// order.
func TestTwoBridgesShareAGroupWithoutLoss(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{oldPartitions: 4, newPartitions: 2})
	b.request(migration.DualWrite, 0)
	const keys, perKey = 16, 100
	recs := keyed(keys, perKey)
	b.produce(recs[:len(recs)/2]...)
	firstLogs := b.logs
	first := b.start(b.cfg)
	b.waitFor("the first bridge copying", func() bool { return first.Stats().Published > 0 })
	cfg := b.cfg
	secondLogs := &ferrytest.Buffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(secondLogs, nil))
	second := b.start(cfg)
	b.waitFor("the second bridge to get partitions", func() bool { return strings.Contains(secondLogs.String(), "partitions assigned") })
	b.produce(recs[len(recs)/2:]...)
	b.waitFor("the group to commit every record", func() bool { return b.committed(bridge.GroupPrefix+b.plan) == keys*perKey })
	if !strings.Contains(firstLogs.String(), "partitions revoked") || second.Stats().Consumed == 0 {
		t.Fatalf("no partition moved: the first bridge's logs\n%s\nthe second's\n%s", firstLogs, secondLogs)
	}
	dups := inKeyOrder(t, b.readB(int(b.onB())), keys, perKey)
	t.Logf("first consumed %d, second %d, %d duplicates", first.Stats().Consumed, second.Stats().Consumed, dups)
}
