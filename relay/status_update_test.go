package relay_test

import (
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/relay"
)

// The status updates of these tests: PostgreSQL drops a walsender that sent
// none for serverTimeout, shorter than every Kafka call the relay makes
// against a channel that does not answer (a topic's limits 10 s, a fence's
// partitions 5 s), so a loop that waits on one of them loses its session.
const (
	statusInterval = time.Second
	serverTimeout  = 3 * statusInterval
)

// sessionWatch follows the relay's replication connection from the
// server's side: its walsender and when it last heard a status update.
type sessionWatch struct {
	b    *bundle
	r    *relay.Relay
	logs *ferrytest.Buffer
	pid  int32
	last time.Time     // reply_time last seen
	gap  time.Duration // the longest time between two status updates seen
}

// watchSession starts watching r's session; r streams already.
func (b *bundle) watchSession(t *testing.T, r *relay.Relay, logs *ferrytest.Buffer) *sessionWatch {
	t.Helper()
	w := &sessionWatch{b: b, r: r, logs: logs}
	waitFor(t, "the relay's walsender", func() bool {
		w.pid, w.last = w.walsender(t)
		return w.pid != 0 && !w.last.IsZero()
	})
	return w
}

func (w *sessionWatch) walsender(t *testing.T) (int32, time.Time) {
	t.Helper()
	var pid *int32
	var reply *time.Time
	err := w.b.db.Pool.QueryRow(w.b.ctx, `SELECT s.active_pid, r.reply_time FROM pg_replication_slots s
		LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, w.b.slot).Scan(&pid, &reply)
	if err != nil {
		t.Fatal(err)
	}
	if pid == nil || reply == nil {
		return 0, time.Time{}
	}
	return *pid, *reply
}

// until waits up to a minute for cond, failing the test as soon as the
// session is not the one being watched: PostgreSQL dropped it, or the relay
// started another.
func (w *sessionWatch) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	sessions := w.r.Stats().Sessions
	for !cond() {
		pid, reply := w.walsender(t)
		if pid != w.pid || w.r.Stats().Sessions != sessions {
			silent := time.Since(w.last)
			// The relay learns of it when its loop next touches the
			// connection: give it the time to say why.
			for i := 0; i < 1500 && sessionEnds(w.logs.String()) == ""; i++ {
				time.Sleep(20 * time.Millisecond)
			}
			t.Fatalf("while waiting for %s, the replication session was reset: walsender %d, now %d, "+
				"%s after the last status update PostgreSQL received (server timeout %s); the relay logged:\n%s",
				what, w.pid, pid, silent.Round(time.Millisecond), serverTimeout, sessionEnds(w.logs.String()))
		}
		if reply.After(w.last) {
			w.gap = max(w.gap, reply.Sub(w.last))
			w.last = reply
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute, still waiting for %s; Ready: %v", what, w.r.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sessionEnds picks the relay's log lines about a session that ended.
func sessionEnds(logs string) string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "session ended") || strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// statusConfig is b's relay configuration with the short server timeout and
// its logs kept in logs.
func statusConfig(b *bundle, logs *ferrytest.Buffer) relay.Config {
	cfg := b.cfg
	cfg.StatusInterval = statusInterval
	cfg.ServerTimeout = serverTimeout
	cfg.ShutdownTimeout = time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return cfg
}

var inFlightSilence = regexp.MustCompile(`Kafka answered none of \d+ records in flight`)

// Before the relay produces to a topic it reads the topic's
// max.message.bytes. With Kafka silent, that call took 10 s inside the
// replication loop, which sent PostgreSQL no status update meanwhile: the
// server dropped the session after its timeout, and the window was
// published again. Now the loop goes on reporting while Kafka says
// nothing; the event arrives once Kafka answers, in the same session.
func TestStatusUpdatesGoOnWhileKafkaIsSilent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	warm := b.topic(t, "warm", 1)
	topic := b.topic(t, "order", 1)
	hole := &ferrytest.Blackhole{}
	logs := &ferrytest.Buffer{}
	cfg := statusConfig(b, logs)
	cfg.KafkaOpts = append(cfg.KafkaOpts, kgo.Dialer(hole.Dial))
	r := b.start(t, cfg)
	consume(t, []string{warm}, b.write(t, evt("warm", "w", 1)), time.Minute, 0)
	w := b.watchSession(t, r, logs)

	hole.Cut()
	want := b.write(t, evt("order", "a", 1)) // its topic's limit is not known yet
	// Not ready after three server timeouts without an answer from Kafka:
	// by then a loop waiting on Kafka would have lost the session.
	w.until(t, "the relay to report Kafka silent", func() bool {
		err := r.Ready()
		return err != nil && inFlightSilence.MatchString(err.Error())
	})
	hole.Restore()
	consume(t, []string{topic}, want, time.Minute, 0)
	w.until(t, "the relay to be ready again", func() bool { return r.Ready() == nil })
	t.Logf("status updates at most %s apart while Kafka was silent (server timeout %s)", w.gap.Round(time.Millisecond), serverTimeout)
}

// A migration step applies inside the replication loop: DUAL_WRITE makes
// the new channel's client and reads the partitions of every topic of both
// channels, to fence them. With the new cluster silent, each of those
// calls took 5 s, with no status update sent meanwhile, so PostgreSQL
// dropped the session, again and again. The same after a restart, where
// the first event of each topic is fenced. Now the loop goes on reporting
// while it waits for the new channel, and once the channel answers every
// event reaches both, in that one session.
func TestStatusUpdatesGoOnWhileTheNewChannelIsSilent(t *testing.T) {
	t.Parallel()
	pit := ferrytest.NewTarpit(t, ferrytest.BrokersB(t)[0])
	m := setupMigration(t, 1, 1, []string{pit.Addr()})
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, m.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	logs := &ferrytest.Buffer{}
	cfg := statusConfig(m.bundle, logs)
	r, stop := runUntilStopped(t, cfg)
	waitState(t, r, relay.StateStreaming)
	w := m.watchSession(t, r, logs)

	// The step: DUAL_WRITE waits for the new channel to fence it.
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 5)
	w.until(t, "the relay to name the new channel as what it waits for", func() bool {
		err := r.Ready()
		return err != nil && strings.Contains(err.Error(), "the new channel does not answer")
	})
	pit.Open()
	m.checkBothChannels(t)
	w.until(t, "the relay to be ready again", func() bool { return r.Ready() == nil })
	t.Logf("status updates at most %s apart while the step waited for the new channel", w.gap.Round(time.Millisecond))
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A new relay in DUAL_WRITE fences each topic at its first event.
	pit.Shut()
	r, stop = runUntilStopped(t, cfg)
	waitState(t, r, relay.StateStreaming)
	w = m.watchSession(t, r, logs)
	m.writeBatch(t, 5)
	w.until(t, "the relay to name the new channel as what it waits for", func() bool {
		err := r.Ready()
		return err != nil && strings.Contains(err.Error(), "the new channel does not answer")
	})
	pit.Open()
	m.checkBothChannels(t)
	w.until(t, "the relay to be ready again", func() bool { return r.Ready() == nil })
	t.Logf("status updates at most %s apart while the first events waited for the new channel", w.gap.Round(time.Millisecond))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// checkBothChannels waits until every event written so far reached the
// channels its step names, each copy stamped as its step says.
func (m *migrationBundle) checkBothChannels(t *testing.T) {
	t.Helper()
	wantOld, wantNew := m.expected()
	oldRecs := readAll(t, ferrytest.Client(t, kgo.ConsumeTopics(m.oldTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantOld, time.Minute)
	newRecs := readAll(t, ferrytest.ClientB(t, kgo.ConsumeTopics(m.newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantNew, time.Minute)
	m.checkCopies(t, migration.OldSide, oldRecs)
	m.checkCopies(t, migration.NewSide, newRecs)
}

// The fences before the first event of a topic in a session are as many
// records as the topic has partitions, beyond the in-flight budget. The
// producer's buffer had room for the budget and one record more, so with
// the budget nearly spent Produce blocked in the replication loop until
// Kafka acknowledged enough: with Kafka silent, no status update went out
// and PostgreSQL dropped the session. Now Produce never blocks, and the
// budget alone holds the loop back, reporting.
func TestStatusUpdatesGoOnWhenFencesFillTheProducer(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 4, 1, nil)
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, m.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	logs := &ferrytest.Buffer{}
	cfg := statusConfig(m.bundle, logs)
	cfg.MaxInFlightRecords = 2 // the producer's buffer held 3; 4 fences
	hole := &ferrytest.Blackhole{}
	// The fences' partitions come from the client's metadata cache, so
	// that the relay knows them with Kafka silent.
	cfg.KafkaOpts = append(cfg.KafkaOpts, kgo.Dialer(hole.Dial), kgo.MetadataMinAge(time.Hour), kgo.MetadataMaxAge(time.Hour))
	r, stop := runUntilStopped(t, cfg)
	t.Cleanup(hole.Restore) // before the stop: a relay stuck in Produce stops once Kafka answers
	waitState(t, r, relay.StateStreaming)
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 1)
	m.checkBothChannels(t) // the relay knows the old topic's limits now

	// A new session fences the old topic's 4 partitions before its first
	// event (one published again, or the next), with Kafka silent.
	hole.Cut()
	var ended bool
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, m.slot).Scan(&ended); err != nil || !ended {
		t.Fatalf("end the relay's session: %v, %v", ended, err)
	}
	waitFor(t, "a second session", func() bool { return r.Stats().Sessions == 2 && r.State() == relay.StateStreaming })
	w := m.watchSession(t, r, logs)
	m.writeBatch(t, 1)
	w.until(t, "the relay to report Kafka silent", func() bool {
		err := r.Ready()
		return err != nil && inFlightSilence.MatchString(err.Error())
	})
	hole.Restore()
	m.checkBothChannels(t)
	w.until(t, "the relay to be ready again", func() bool { return r.Ready() == nil })
	t.Logf("status updates at most %s apart while the fences waited for Kafka", w.gap.Round(time.Millisecond))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
