package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// commitTimeout bounds one offset commit; the next commit carries the same
// offsets again.
const commitTimeout = 10 * time.Second

// ErrTopicLoop is a copy that would land on a topic the bridge reads: the
// plan's old and new channel are one cluster, and the topic's new name is
// one the bridge copies from.
var ErrTopicLoop = errors.New("bridge: a copy would be read again")

// Bridge copies the records of a migration's old channel to its new one.
// Make one with New; Run copies until its context ends.
type Bridge struct {
	cfg    Config
	ctl    *migration.Controller
	log    *slog.Logger
	re     *regexp.Regexp // Config.TopicRegex, anchored; nil without one
	copier copier

	// sameCluster is set when the plan's channels share their brokers: a
	// copy must then never land on a topic the bridge reads.
	sameCluster bool

	watch     atomic.Pointer[stepWatch]
	publisher atomic.Pointer[rabbitPublisher] // the last to a RabbitMQ new channel
	topics    atomic.Pointer[topicWatch]      // nil without Config.Topics
	waiting   atomic.Bool
	consumed  atomic.Int64
	published atomic.Int64
	derived   atomic.Int64
	skipped   atomic.Int64
	commits   atomic.Int64
}

// Stats are a bridge's counters since New.
type Stats struct {
	Phase      migration.Phase // the plan's phase at its step as last read
	Epoch      int             // that step's epoch (0: the plan's creation)
	Slices     int             // slices moved to the new channel at that step (CUTOVER)
	StepReads  int64           // successful reads of the step
	Waiting    bool            // the step is OLD_ONLY: nothing is copied or committed
	Consumed   int64           // records read from the old channel and sent to the new one
	Published  int64           // copies the new cluster acknowledged
	DerivedIDs int64           // copies whose id was derived from the key and value
	Commits    int64           // offset commits the old cluster accepted
	Skipped    int64           // Ferry's own messages on a RabbitMQ old channel (fences, stamped events): not copied

	// MissingTopics are the topics of Config.Topics the old cluster did
	// not have at the last check (Config.TopicCheckInterval).
	MissingTopics []string
}

// RefusedError is a record the new cluster refused for good: larger than
// the new topic (or the client's batch limit) allows, a topic that does
// not exist there, an authorization it denies. The bridge does not skip
// it: it stops, and commits nothing of the record's partition from it
// on. Fix the cause and start the bridge again; it resumes at this record.
type RefusedError struct {
	Topic     string // on the old channel (a RabbitMQ exchange)
	Partition int32  // a RabbitMQ shard
	Offset    int64  // a RabbitMQ delivery tag
	// Queue is the bridge's queue on a RabbitMQ old channel; "" on Kafka.
	Queue    string
	NewTopic string
	Err      error
}

func (e *RefusedError) Error() string {
	if e.Queue != "" {
		return fmt.Sprintf("bridge: the new cluster refused the copy of a message of exchange %s from the bridge's queue %s (to topic %s): %v; "+
			"it and the queue's later messages stay unacknowledged there: fix the cause and start the bridge again",
			e.Topic, e.Queue, e.NewTopic, e.Err)
	}
	return fmt.Sprintf("bridge: the new cluster refused the copy of %s partition %d offset %d (to topic %s): %v; "+
		"nothing of that partition from this offset on is committed: fix the cause and start the bridge again",
		e.Topic, e.Partition, e.Offset, e.NewTopic, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// New validates cfg and returns a bridge. Its errors name the field.
func New(c *Config) (*Bridge, error) {
	if c == nil {
		return nil, errors.New("bridge: Config is nil")
	}
	cfg := c.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	re, _ := cfg.regex() // validated
	return &Bridge{
		cfg: cfg,
		ctl: &migration.Controller{DB: cfg.DB},
		log: cfg.Logger.With(slog.String("plan", cfg.Plan)),
		re:  re,
		copier: copier{plan: cfg.Plan, idHeader: cfg.IDHeader, fromPayload: cfg.IDFrom == IDFromPayload,
			topicMap: cfg.TopicMap, template: cfg.TopicTemplate},
	}, nil
}

// Stats returns the bridge's counters.
func (b *Bridge) Stats() Stats {
	st := Stats{
		Waiting:    b.waiting.Load(),
		Consumed:   b.consumed.Load(),
		Published:  b.published.Load(),
		DerivedIDs: b.derived.Load(),
		Commits:    b.commits.Load(),
		Skipped:    b.skipped.Load(),
	}
	if w := b.watch.Load(); w != nil {
		step, _ := w.current()
		st.Phase, st.Epoch, st.Slices = step.Phase, step.Epoch, step.Slices
		st.StepReads = w.reads.Load()
	}
	if tw := b.topics.Load(); tw != nil {
		if ts := tw.state.Load(); ts != nil {
			st.MissingTopics = slices.Clone(ts.missing)
		}
	}
	return st
}

// Ready says whether the bridge does its work: nil once Run follows the
// plan (copying, or waiting while it is OLD_ONLY) and every topic of
// Config.Topics exists on the old cluster and can be read; otherwise why
// not, naming the topics. It is what `relay bridge` answers on /readyz.
func (b *Bridge) Ready() error {
	if b.watch.Load() == nil {
		return errors.New("bridge: not following the plan yet")
	}
	if p := b.publisher.Load(); p != nil {
		if hold := p.Hold(); hold != "" {
			return errors.New("bridge: " + hold)
		}
	}
	if tw := b.topics.Load(); tw != nil {
		return tw.state.Load().problem()
	}
	return nil
}

// Run copies until ctx ends, and returns nil then. While the plan is
// OLD_ONLY it waits: it reads nothing and commits nothing. It returns an
// error when the plan cannot be found or its channels cannot be reached
// as configured, when a copy would land on a topic the bridge reads, and
// with a *RefusedError when the new cluster refuses a record for good.
// Run may be called again after it returned.
func (b *Bridge) Run(ctx context.Context) error {
	st, err := b.readPlan(ctx)
	if err != nil || st == nil {
		return err
	}
	newPub, err := b.publisherFor(st.Plan)
	if err != nil {
		return err
	}
	if err := b.checkLoop(st.Plan); err != nil {
		return err
	}
	b.copier.keyHeader = st.Plan.New.KindOf() == migration.RabbitMQ
	if st.Plan.Old.KindOf() == migration.RabbitMQ {
		return b.runFromRabbitMQ(ctx, st, newPub)
	}
	oldOpts, err := st.Plan.Old.KafkaOpts(string(migration.OldSide), b.cfg.Getenv)
	if err != nil {
		return fmt.Errorf("bridge: plan %q: %w", b.cfg.Plan, err)
	}
	var topics *topicWatch
	if len(b.cfg.Topics) > 0 {
		adm, err := kgo.NewClient(append(slices.Clone(oldOpts), b.cfg.OldKafkaOpts...)...)
		if err != nil {
			return fmt.Errorf("bridge: old channel's client: %w", err)
		}
		defer adm.Close() // after the watches below have ended
		topics = &topicWatch{adm: kadm.NewClient(adm), topics: b.cfg.Topics, interval: b.cfg.TopicCheckInterval, log: b.log}
		b.topics.Store(topics)
	}
	watch := newStepWatch(b.ctl, st, b.cfg.StepInterval, b.log)
	b.watch.Store(watch)
	wctx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { watch.run(wctx) })
	if topics != nil {
		watching.Go(func() { topics.run(wctx) })
	}
	defer watching.Wait()
	defer stopWatch()

	b.log.Info("bridge following the plan", slog.String("group", b.cfg.Group),
		slog.Any("topics", b.cfg.Topics), slog.String("topic_regex", b.cfg.TopicRegex),
		slog.Any("old_brokers", st.Plan.Old.Brokers), slog.Any("new_brokers", st.Plan.New.Brokers),
		slog.String("phase", string(st.Phase)), slog.Int("epoch", st.Epoch))
	return b.follow(ctx, watch, func() (error, error) { return b.copyWhileActive(ctx, watch, oldOpts, newPub) })
}

// follow runs copying sessions until ctx ends: each one once the step is
// past OLD_ONLY, until it goes back there, a copy is refused (the error:
// Run returns it), or a channel is lost (lost: the next session starts
// after a backoff).
func (b *Bridge) follow(ctx context.Context, watch *stepWatch, session func() (lost, err error)) error {
	retry := backoff.Sequence{Base: 250 * time.Millisecond, Ceiling: 10 * time.Second}
	for {
		if !b.awaitCopying(ctx, watch) {
			return nil
		}
		lost, err := session()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if lost == nil {
			retry.Reset()
			continue
		}
		if !b.waitLost(ctx, &retry, lost) {
			return nil
		}
	}
}

// publisherFor returns how a session reaches the plan's new channel.
func (b *Bridge) publisherFor(p migration.Plan) (func() (publisher, error), error) {
	if p.New.KindOf() == migration.RabbitMQ {
		pc := rabbitmq.PlanChannel{Side: string(migration.NewSide), URL: p.New.URL, PasswordEnv: p.New.PasswordEnv}
		if _, err := pc.Conn(b.cfg.Getenv); err != nil {
			return nil, fmt.Errorf("bridge: plan %q: %w", b.cfg.Plan, err)
		}
		return func() (publisher, error) { return b.newRabbitPublisher(p) }, nil
	}
	newOpts, err := p.New.KafkaOpts(string(migration.NewSide), b.cfg.Getenv)
	if err != nil {
		return nil, fmt.Errorf("bridge: plan %q: %w", b.cfg.Plan, err)
	}
	return func() (publisher, error) {
		cl, err := kgo.NewClient(b.producerOpts(newOpts)...)
		if err != nil {
			return nil, fmt.Errorf("bridge: new channel's client: %w", err)
		}
		return cl, nil
	}, nil
}

// waitLost logs a session lost to its channel and waits before the next;
// false when ctx ended.
func (b *Bridge) waitLost(ctx context.Context, retry *backoff.Sequence, lost error) bool {
	wait := retry.Next()
	b.log.Warn("lost a channel; what was not acknowledged is copied again", slog.String("error", lost.Error()),
		slog.Duration("retry_in", wait))
	select {
	case <-ctx.Done():
		return false
	case <-time.After(wait):
		return true
	}
}

// readPlan reads the plan's state, retrying while the database does not
// answer; nil, nil when ctx ends first.
func (b *Bridge) readPlan(ctx context.Context) (*migration.State, error) {
	retry := backoff.Sequence{Base: b.cfg.StepInterval, Ceiling: 30 * time.Second}
	for {
		st, err := b.ctl.State(ctx, b.cfg.Plan)
		switch {
		case err == nil:
			return st, nil
		case errors.Is(err, migration.ErrNotFound):
			return nil, fmt.Errorf("bridge: Config.Plan: %w (create the plan first)", err)
		case ctx.Err() != nil:
			return nil, nil
		}
		wait := retry.Next()
		b.log.Warn("cannot read the plan; retrying", slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
	}
}

// checkLoop refuses to copy a topic onto one the bridge reads, which on
// one cluster would copy every record forever.
func (b *Bridge) checkLoop(p migration.Plan) error {
	if p.Old.KindOf() == migration.Kafka {
		b.sameCluster = p.New.KindOf() == migration.Kafka && sameBrokers(p.Old.Brokers, p.New.Brokers)
	} else {
		b.sameCluster = p.Old.SameBroker(p.New)
	}
	if !b.sameCluster {
		return nil
	}
	for _, t := range b.cfg.Topics {
		if err := b.loop(t, newTopic(b.cfg.TopicMap, b.cfg.TopicTemplate, t)); err != nil {
			return err
		}
	}
	return nil
}

// loop returns an error when a copy of topic from, going to topic to on the
// same cluster, would be read again.
func (b *Bridge) loop(from, to string) error {
	if !b.sameCluster || (!slices.Contains(b.cfg.Topics, to) && (b.re == nil || !b.re.MatchString(to))) {
		return nil
	}
	field := "Config.TopicTemplate"
	if _, ok := b.cfg.TopicMap[from]; ok {
		field = "Config.TopicMap"
	}
	return fmt.Errorf("%w: %s: topic %s would be copied to %s, which the bridge reads too: "+
		"plan %q's old and new channel are one cluster; give the copies other names", ErrTopicLoop, field, from, to, b.cfg.Plan)
}

func sameBrokers(a, b []string) bool {
	norm := func(s []string) []string {
		out := make([]string, 0, len(s))
		for _, x := range s {
			out = append(out, strings.ToLower(strings.TrimSpace(x)))
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(norm(a), norm(b))
}

type topicPartition struct {
	topic     string
	partition int32
}

// session is one stretch of copying, from a step that writes the new
// channel to the end of the run or a step back to OLD_ONLY: a consumer in
// the bridge's group on the old cluster and an idempotent producer on the
// new one.
type session struct {
	b        *Bridge
	watch    *stepWatch
	consumer *kgo.Client
	producer publisher
	stopPoll context.CancelFunc

	mu       sync.Mutex
	answered *sync.Cond // broadcast on every answer of the new cluster
	parts    map[topicPartition]*commitTracker
	inflight int
	stopping bool  // answers are the producer's close: not refusals
	refused  error // the first refusal
	lost     error // the new channel lost (errLost): the session ends, the next copies again

	// commitMu orders the commits: a periodic commit never lands after
	// the final commit of a revoke. It is taken before mu.
	commitMu sync.Mutex
}

// copyWhileActive copies until ctx ends, a record is refused (the error),
// the new channel is lost (lost), or the step goes back to OLD_ONLY; then
// it waits for the acknowledgements in flight (Config.ShutdownTimeout),
// commits and leaves the group. What it read and did not commit is read
// again by the next session.
func (b *Bridge) copyWhileActive(ctx context.Context, watch *stepWatch, oldOpts []kgo.Opt, newPub func() (publisher, error)) (lost, err error) {
	s := &session{b: b, watch: watch, parts: map[topicPartition]*commitTracker{}}
	s.answered = sync.NewCond(&s.mu)

	producer, err := newPub()
	if errors.Is(err, errLost) {
		return err, nil
	}
	if err != nil {
		return nil, err
	}
	s.producer = producer
	consumer, err := kgo.NewClient(b.consumerOpts(oldOpts, s)...)
	if err != nil {
		producer.Close()
		return nil, fmt.Errorf("bridge: old channel's client: %w", err)
	}
	s.consumer = consumer

	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	s.stopPoll = stopPoll
	stopWake := context.AfterFunc(pollCtx, s.wake)
	defer stopWake()
	go s.endAtOldOnly(pollCtx)
	commitCtx, stopCommits := context.WithCancel(context.Background())
	var committer sync.WaitGroup
	committer.Go(func() { s.commitLoop(commitCtx) })

	s.poll(pollCtx)

	if n := s.waitAnswers(s.all(), b.cfg.ShutdownTimeout); n > 0 {
		b.log.Warn("stopping before the new cluster answered every copy; those are copied again next time",
			slog.Int("unanswered", n), slog.Duration("shutdown_timeout", b.cfg.ShutdownTimeout))
	}
	stopCommits()
	committer.Wait()
	s.commit(s.takeAll())
	s.mu.Lock()
	s.stopping = true
	refused, lost := s.refused, s.lost
	s.mu.Unlock()
	consumer.CloseAllowingRebalance()
	producer.Close()
	if refused == nil && lost == nil && ctx.Err() == nil {
		b.log.Info("the plan went back to OLD_ONLY: the bridge left its group; what it had not copied is read again later")
	}
	return lost, refused
}

// producerOpts are the new channel's options plus the bridge's own:
// franz-go's idempotent producer (acks from every in-sync replica, order
// kept per partition, retries without limit, so an outage of the new
// cluster only delays), records partitioned by key as Kafka's Java client
// does, so that an aggregate's records stay in one partition.
func (b *Bridge) producerOpts(newOpts []kgo.Opt) []kgo.Opt {
	opts := append(slices.Clone(newOpts), b.cfg.NewKafkaOpts...)
	return append(opts,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// franz-go counts a record out only after its promise returns:
		// room beyond the bridge's own bound keeps Produce from blocking.
		kgo.MaxBufferedRecords(2*b.cfg.MaxInFlightRecords),
	)
}

// consumerOpts are the old channel's options plus the bridge's group:
// no autocommit (the bridge commits behind the new cluster's acks),
// committed records only (an aborted transaction is not copied), and
// rebalances held while a poll is being sent.
func (b *Bridge) consumerOpts(oldOpts []kgo.Opt, s *session) []kgo.Opt {
	opts := append(slices.Clone(oldOpts), kgo.FetchMaxWait(500*time.Millisecond))
	opts = append(opts, b.cfg.OldKafkaOpts...)
	start := kgo.NewOffset().AtStart()
	if b.cfg.OffsetReset == OffsetResetLatest {
		start = kgo.NewOffset().AtEnd()
	}
	topics := b.cfg.Topics
	if b.re != nil {
		topics = []string{b.re.String()}
		for _, t := range b.cfg.Topics {
			topics = append(topics, "^"+regexp.QuoteMeta(t)+"$")
		}
		opts = append(opts, kgo.ConsumeRegex())
	}
	return append(opts,
		kgo.ConsumerGroup(b.cfg.Group),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeStartOffset(start),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
	)
}

// endAtOldOnly stops the poll when the step goes back to OLD_ONLY.
func (s *session) endAtOldOnly(ctx context.Context) {
	for {
		step, changed := s.watch.current()
		if step.Phase == migration.OldOnly {
			s.stopPoll()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

func (s *session) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answered.Broadcast()
}

// poll reads the old channel and sends each record's copy, in the order
// of its partition, until ctx ends or a record is refused. Each copy is
// stamped with the step current when its poll returned.
func (s *session) poll(ctx context.Context) {
	for {
		room := s.waitRoom(ctx)
		if room == 0 {
			return
		}
		fetches := s.consumer.PollRecords(ctx, room)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			s.consumer.AllowRebalance()
			return
		}
		step, _ := s.watch.current()
		if step.Phase == migration.OldOnly {
			s.consumer.AllowRebalance() // not copied, not committed: read again later
			return
		}
		failed := false
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			failed = true
			s.b.log.Error("fetch from the old channel failed", slog.String("topic", topic),
				slog.Int("partition", int(partition)), slog.String("error", err.Error()))
		})
		ok := true
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 || !ok {
				return
			}
			t := s.tracker(fp.Topic, fp.Partition)
			for _, r := range fp.Records {
				if ok = s.send(t, r, step); !ok {
					return
				}
			}
		})
		s.consumer.AllowRebalance()
		if !ok {
			return
		}
		if failed && fetches.NumRecords() == 0 {
			// A partition in a fatal state answers at once: no spinning.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// waitRoom waits until fewer than Config.MaxInFlightRecords copies are
// unanswered, and returns how many more may be sent; 0 when ctx ended or
// a record was refused.
func (s *session) waitRoom(ctx context.Context) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.inflight >= s.b.cfg.MaxInFlightRecords && ctx.Err() == nil && s.refused == nil {
		s.answered.Wait()
	}
	if ctx.Err() != nil || s.refused != nil {
		return 0
	}
	return s.b.cfg.MaxInFlightRecords - s.inflight
}

// tracker returns the commit tracker of an owned partition. With
// BlockRebalanceOnPoll, polled records belong to partitions the member
// owns at that moment.
func (s *session) tracker(topic string, partition int32) *commitTracker {
	tp := topicPartition{topic, partition}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.parts[tp]
	if !ok {
		t = newCommitTracker()
		s.parts[tp] = t
	}
	return t
}

// send sends r's copy; false when the bridge must stop.
func (s *session) send(t *commitTracker, r *kgo.Record, step route.Step) bool {
	out, derived, _ := s.b.copier.copyOf(r, step) // step is not OLD_ONLY
	if err := s.b.loop(r.Topic, out.Topic); err != nil {
		s.refuse(err)
		return false
	}
	s.mu.Lock()
	t.add(r.Offset, r.LeaderEpoch)
	s.inflight++
	s.mu.Unlock()
	s.b.consumed.Add(1)
	if derived {
		s.b.derived.Add(1)
	}
	// Not the run's context: a copy ends acknowledged, refused, or failed
	// by the producer's close, never half-cancelled.
	s.producer.Produce(context.Background(), out, func(_ *kgo.Record, err error) { s.answer(t, r, out.Topic, err) })
	return true
}

// answer takes the new cluster's answer for the copy of r.
func (s *session) answer(t *commitTracker, r *kgo.Record, newTopic string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	s.answered.Broadcast()
	if err == nil {
		t.ack(r.Offset)
		s.b.published.Add(1)
		return
	}
	t.refuse()
	if s.stopping || s.refused != nil || s.lost != nil {
		return
	}
	if errors.Is(err, errLost) {
		s.lost = err
		s.stopPoll()
		return
	}
	s.refused = &RefusedError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, NewTopic: newTopic, Err: err}
	s.b.log.Error("the new cluster refused a copy; the bridge stops", slog.String("topic", r.Topic),
		slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset), slog.String("new_topic", newTopic),
		slog.String("error", err.Error()))
	s.stopPoll()
}

func (s *session) refuse(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused == nil {
		s.refused = err
	}
	s.stopPoll()
}

// waitAnswers waits up to d until every copy sent of parts has its
// answer, and returns how many still have none.
func (s *session) waitAnswers(parts map[topicPartition]*commitTracker, d time.Duration) int {
	return waitAnswered(&s.mu, s.answered, d, func() int {
		n := 0
		for _, t := range parts {
			n += t.waiting()
		}
		return n
	})
}

// waitAnswered waits on answered (whose locker is mu) for up to d until
// unanswered, called with mu held, is 0, and returns what it last said.
// The timer says the time is up under mu: a deadline read from the clock
// after the timer started could lie ahead of a wake-up already gone, and
// the wait would never end.
func waitAnswered(mu *sync.Mutex, answered *sync.Cond, d time.Duration, unanswered func() int) int {
	up := false // guarded by mu
	timer := time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		up = true
		answered.Broadcast()
	})
	defer timer.Stop()
	mu.Lock()
	defer mu.Unlock()
	for {
		if n := unanswered(); n == 0 || up {
			return n
		}
		answered.Wait()
	}
}

func (s *session) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	if len(assigned) > 0 {
		s.b.log.Info("partitions assigned", slog.String("group", s.b.cfg.Group), slog.Any("partitions", assigned))
	}
}

// onRevoked waits for the revoked partitions' copies in flight (up to
// Config.ShutdownTimeout) and commits what the new cluster acknowledged,
// while the member still owns them.
func (s *session) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	parts := s.take(revoked)
	if len(parts) == 0 {
		return
	}
	s.b.log.Info("partitions revoked: committing what the new cluster acknowledged", slog.Any("partitions", revoked))
	s.waitAnswers(parts, s.b.cfg.ShutdownTimeout)
	s.commit(parts)
}

// onLost forgets the lost partitions without committing: another member
// may own them already.
func (s *session) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(s.take(lost)) > 0 {
		s.b.log.Warn("partitions lost (group membership ended); their copies in flight stay uncommitted", slog.Any("partitions", lost))
	}
}

// take removes partitions from the owned set, so that no later periodic
// commit includes them; a periodic commit in flight ends first.
func (s *session) take(tps map[string][]int32) map[topicPartition]*commitTracker {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[topicPartition]*commitTracker{}
	for topic, ids := range tps {
		for _, id := range ids {
			tp := topicPartition{topic, id}
			if t, ok := s.parts[tp]; ok {
				out[tp] = t
				delete(s.parts, tp)
			}
		}
	}
	return out
}

func (s *session) takeAll() map[topicPartition]*commitTracker {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.parts
	s.parts = map[topicPartition]*commitTracker{}
	return out
}

// all is a copy of the owned set.
func (s *session) all() map[topicPartition]*commitTracker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.parts)
}

func (s *session) commitLoop(ctx context.Context) {
	t := time.NewTicker(s.b.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.commitMu.Lock()
		s.commitLocked(s.all())
		s.commitMu.Unlock()
	}
}

// commit commits the acknowledged prefix of each of parts that moved since
// its last commit. A failure is logged; the next commit carries the same
// offsets again.
func (s *session) commit(parts map[topicPartition]*commitTracker) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.commitLocked(parts)
}

func (s *session) commitLocked(parts map[topicPartition]*commitTracker) {
	var (
		recs   []*kgo.Record
		moved  []*commitTracker
		points []kgo.EpochOffset
	)
	s.mu.Lock()
	for tp, t := range parts {
		if at, ok := t.uncommitted(); ok {
			// CommitRecords commits offset+1 of each record.
			recs = append(recs, &kgo.Record{Topic: tp.topic, Partition: tp.partition, LeaderEpoch: at.Epoch, Offset: at.Offset - 1})
			moved = append(moved, t)
			points = append(points, at)
		}
	}
	s.mu.Unlock()
	if len(recs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	if err := s.consumer.CommitRecords(ctx, recs...); err != nil {
		s.b.log.Warn("offset commit on the old cluster failed; the next commit retries it", slog.String("error", err.Error()))
		return
	}
	s.b.commits.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range moved {
		t.markCommitted(points[i])
	}
}
