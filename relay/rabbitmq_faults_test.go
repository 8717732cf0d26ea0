//go:build faults

package relay_test

import (
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/relay"
)

// These tests starve or disconnect the stack's RabbitMQ node, which every
// other RabbitMQ test shares: like the Kafka fault tests they run alone
// (`go test -tags faults -run Fault`), never in parallel.

// memoryAlarm raises RabbitMQ's memory alarm, which blocks every
// publishing connection, until the returned function (also a cleanup)
// clears it.
func memoryAlarm(t *testing.T) (clear func()) {
	t.Helper()
	ferrytest.RabbitMQCtl(t, "set_vm_memory_high_watermark", "0")
	cleared := false
	clear = func() {
		if !cleared {
			cleared = true
			ferrytest.RabbitMQCtl(t, "set_vm_memory_high_watermark", "0.4")
		}
	}
	t.Cleanup(clear)
	return clear
}

// The broker closes every connection mid-stream, twice: the session fails
// and resends from the confirmed position on a new connection; nothing is
// lost and every aggregate's events first arrive in order.
func TestFaultRabbitMQConnectionsClosedMidStream(t *testing.T) {
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	r := b.start(t, b.cfg)
	l := b.startLoad(t, "order", 5, 2*time.Millisecond)
	for range 2 {
		l.waitCount(t, l.count()+300)
		ferrytest.RabbitMQCtl(t, "close_all_connections", "--global", "ferry fault test")
	}
	l.waitCount(t, l.count()+300)
	ids := l.finish()
	b.waitConfirmed(t, time.Minute)
	got := drainRabbit(t, topic)
	if n := got.missing(ids); n != 0 {
		t.Fatalf("%d of %d events lost after the broker closed the connections", n, len(ids))
	}
	got.checkFirstArrivalOrder(t)
	st := r.Stats()
	if st.Sessions < 3 {
		t.Errorf("%d sessions: each close must fail the session", st.Sessions)
	}
	t.Logf("%d events, %d duplicates, %d sessions", len(ids), got.duplicates(), st.Sessions)
}

// The broker closes the relay's connection while its publishes wait,
// unconfirmed and unread, behind a memory alarm: their outcome is unknown,
// so the session fails them all and resends from the confirmed position on
// a new connection. Treating them as confirmed would lose them.
func TestFaultRabbitMQConnectionsClosedWithPublishesUnconfirmed(t *testing.T) {
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	r := b.start(t, b.cfg)
	before := b.writeAggregates(t, "order", 5, 0, 5)
	b.waitConfirmed(t, 30*time.Second)

	clear := memoryAlarm(t)
	during := b.writeAggregates(t, "order", 10, 100, 20)
	deadline := time.Now().Add(30 * time.Second)
	for r.Ready() == nil || !strings.Contains(r.Ready().Error(), "blocked") {
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want the block", r.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ferrytest.RabbitMQCtl(t, "close_all_connections", "--global", "ferry fault test")
	// The close fails the session; the next one connects, still blocked.
	deadline = time.Now().Add(30 * time.Second)
	for r.Stats().Sessions < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions 30s after the broker closed the connection", r.Stats().Sessions)
		}
		time.Sleep(50 * time.Millisecond)
	}
	clear()
	b.waitConfirmed(t, time.Minute)
	got := drainRabbit(t, topic)
	ids := append(before, during...)
	if n := got.missing(ids); n != 0 {
		t.Fatalf("%d of %d events lost when the broker closed a blocked connection", n, len(ids))
	}
	got.checkFirstArrivalOrder(t)
	if st := r.Stats(); st.Sessions < 2 {
		t.Errorf("%d sessions: the close must fail the session", st.Sessions)
	}
}

// A memory alarm blocks the relay's connection: Ready names the block,
// nothing is confirmed past what the broker confirmed, and once the alarm
// clears everything drains, nothing lost.
func TestFaultRabbitMQMemoryAlarmBlocksThenDrains(t *testing.T) {
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	r := b.start(t, b.cfg)
	before := b.writeAggregates(t, "order", 5, 0, 5)
	b.waitConfirmed(t, 30*time.Second)

	clear := memoryAlarm(t)
	held := b.currentLSN(t)
	during := b.writeAggregates(t, "order", 10, 100, 20)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := r.Ready()
		if err != nil && strings.Contains(err.Error(), "RabbitMQ blocked the connection") {
			t.Logf("Ready: %v", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want it to name RabbitMQ's block", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.waitStatusUpdates(t, 3) // status updates go on; none may pass the block
	if c := b.slotConfirmedLSN(t); c > held {
		t.Fatalf("confirmed_flush_lsn %s moved past %s while RabbitMQ confirmed nothing", c, held)
	}
	clear()
	b.waitConfirmed(t, time.Minute)
	got := drainRabbit(t, topic)
	ids := append(before, during...)
	if n := got.missing(ids); n != 0 {
		t.Fatalf("%d of %d events lost across the memory alarm", n, len(ids))
	}
	got.checkFirstArrivalOrder(t)
	deadline = time.Now().Add(10 * time.Second)
	for r.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("Ready after the alarm cleared: %v", r.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startRabbitProc runs `relay run` as a process that publishes to the
// stack's RabbitMQ.
func (b *bundle) startRabbitProc(t *testing.T, name string) *proc {
	t.Helper()
	cmd := exec.Command(relayBin, "run", "--slot", b.slot, "--topic-template", b.cfg.TopicTemplate,
		"--http-addr", "off", "--log-format", "text", "--log-level", "debug",
		"--rabbitmq-url", b.cfg.RabbitMQ.URL)
	cmd.Env = append(os.Environ(), "FERRY_DATABASE_URL="+b.db.URL, "FERRY_KAFKA_BROKERS=",
		"FERRY_RABBITMQ_PASSWORD="+b.cfg.RabbitMQ.Password)
	p := &proc{t: t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("--- output of %s:\n%s", name, p.out.String())
		}
	})
	return p
}

// The publisher dies before the broker confirmed (confirms held back by a
// memory alarm): the relay restarted later publishes again from the slot,
// and nothing is lost.
func TestFaultRabbitMQRelayKilledBeforeConfirm(t *testing.T) {
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, "ferry", nil); err != nil {
		t.Fatal(err)
	}
	p := b.startRabbitProc(t, "relay-1")
	p.waitLog("streaming from slot", time.Minute)
	before := b.writeAggregates(t, "order", 5, 0, 4)
	b.waitConfirmed(t, 30*time.Second)

	clear := memoryAlarm(t)
	held := b.slotConfirmedLSN(t)
	during := b.writeAggregates(t, "order", 10, 100, 20)
	p.waitLog("rabbitmq blocks the relay's connection", 30*time.Second)
	b.waitStatusUpdates(t, 2) // the relay reports on, confirming nothing
	p.signal(syscall.SIGKILL)
	p.wait(10 * time.Second)
	if c := b.slotConfirmedLSN(t); c > held {
		t.Fatalf("confirmed_flush_lsn %s moved past %s without confirms", c, held)
	}
	clear()
	b.startRabbitProc(t, "relay-2").waitLog("streaming from slot", time.Minute)
	b.waitConfirmed(t, time.Minute)
	got := drainRabbit(t, topic)
	ids := append(before, during...)
	if n := got.missing(ids); n != 0 {
		t.Fatalf("%d of %d events lost when the relay died before the confirms", n, len(ids))
	}
	got.checkFirstArrivalOrder(t)
	t.Logf("%d events, %d duplicates", len(ids), got.duplicates())
}

// The broker stops under load and stays down a while: the idle-or-not
// relay turns unready (its ping and its unconfirmed records say RabbitMQ
// does not answer), dials again with backoff, and once the broker is back
// delivers everything, nothing lost, what it confirmed kept by the quorum
// queues across the restart.
func TestFaultRabbitMQBrokerRestartUnderLoad(t *testing.T) {
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	cfg := b.cfg
	cfg.StatusInterval = 500 * time.Millisecond
	cfg.ServerTimeout = 2 * time.Second
	r := b.start(t, cfg)
	l := b.startLoad(t, "order", 5, 5*time.Millisecond)
	l.waitCount(t, 300)
	ferrytest.Stack(t, "rabbitmq-stop")
	deadline := time.Now().Add(30 * time.Second)
	for r.Ready() == nil {
		if time.Now().After(deadline) {
			t.Fatal("Ready stayed nil with RabbitMQ stopped")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("Ready with RabbitMQ stopped: %v", r.Ready())
	ferrytest.Stack(t, "rabbitmq-start")
	l.waitCount(t, l.count()+300)
	ids := l.finish()
	b.waitConfirmed(t, 2*time.Minute)
	got := drainRabbit(t, topic)
	if n := got.missing(ids); n != 0 {
		t.Fatalf("%d of %d events lost across a broker restart", n, len(ids))
	}
	got.checkFirstArrivalOrder(t)
	t.Logf("%d events, %d duplicates, %d sessions", len(ids), got.duplicates(), r.Stats().Sessions)
}

// The relay user's write permission is revoked while it streams. RabbitMQ
// keeps a channel's permission checks cached, so the open channels publish
// on; once the broker closes the connections, the new connection's probe
// finds the write refused and holds the exchange in place (Ready: not
// authorized) instead of looping sessions; once the permission is back,
// everything arrives.
func TestFaultRabbitMQPermissionRevokedMidStream(t *testing.T) {
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	u, err := url.Parse(need(t, ferrytest.EnvRabbitMQURL))
	if err != nil {
		t.Fatal(err)
	}
	user := need(t, ferrytest.EnvRabbitMQRelayUser)
	u.User = url.User(user)
	cfg := b.cfg
	cfg.RabbitMQ = &relay.RabbitMQConfig{URL: u.String(), Password: need(t, ferrytest.EnvRabbitMQRelayPassword)}
	cfg.ShutdownTimeout = time.Second
	r := b.start(t, cfg)
	before := b.writeAggregates(t, "order", 5, 0, 5)
	b.waitConfirmed(t, 30*time.Second)

	vhost := strings.TrimPrefix(u.Path, "/")
	restore := func() { ferrytest.RabbitMQCtl(t, "set_permissions", "-p", vhost, user, "^$", `^outbox\.`, "^$") }
	t.Cleanup(restore)
	ferrytest.RabbitMQCtl(t, "set_permissions", "-p", vhost, user, "^$", "^$", "^$")
	ferrytest.RabbitMQCtl(t, "close_all_connections", "--global", "ferry fault test")
	during := b.writeAggregates(t, "order", 5, 100, 5)
	deadline := time.Now().Add(30 * time.Second)
	for r.Ready() == nil || !strings.Contains(r.Ready().Error(), "not authorized") {
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want the exchange not authorized", r.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	sessions := r.Stats().Sessions
	b.waitStatusUpdates(t, 3)
	if s := r.Stats().Sessions; s != sessions || s > 2 {
		t.Errorf("sessions %d then %d: a refused write must be held, not looped", sessions, s)
	}
	restore()
	b.waitConfirmed(t, time.Minute)
	got := drainRabbit(t, topic)
	ids := append(before, during...)
	if n := got.missing(ids); n != 0 {
		t.Fatalf("%d of %d events lost across the revoked permission", n, len(ids))
	}
	got.checkFirstArrivalOrder(t)
	t.Logf("%d sessions", r.Stats().Sessions)
}
