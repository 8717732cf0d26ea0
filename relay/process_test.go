package relay_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// proc is a relay running as a real OS process.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startProc runs `relay run` against the bundle's database and topics.
func (b *bundle) startProc(t *testing.T, name string, extra ...string) *proc {
	t.Helper()
	return b.startProcEnv(t, name, os.Environ(), extra...)
}

// startProcEnv is startProc with environ instead of the test's environment.
func (b *bundle) startProcEnv(t *testing.T, name string, environ []string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"run",
		"--slot", b.slot,
		"--topic-template", b.cfg.TopicTemplate,
		"--http-addr", "off",
		"--log-format", "text",
		"--log-level", "debug",
	}, extra...)
	cmd := exec.Command(relayBin, args...)
	cmd.Env = append(slices.Clone(environ),
		"FERRY_DATABASE_URL="+b.db.URL,
		"FERRY_KAFKA_BROKERS="+ferrytest.Brokers(t)[0],
	)
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

func (p *proc) signal(sig syscall.Signal) {
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %s: %v", p.name, err)
	}
}

// `relay run` runs Go code on one P (GOMAXPROCS=1) unless GOMAXPROCS says
// otherwise, and says so when it starts.
func TestRelayRunsOnOnePUnlessGOMAXPROCSIsSet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "order", 1)
	var unset []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			unset = append(unset, kv)
		}
	}
	one := b.startProcEnv(t, "relay-default", unset)
	one.waitLog("gomaxprocs=1", 30*time.Second)
	two := b.startProcEnv(t, "relay-gomaxprocs-2", append(unset, "GOMAXPROCS=2"))
	two.waitLog("gomaxprocs=2", 30*time.Second)
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitLog waits until the process logged substr.
func (p *proc) waitLog(substr string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !bytes.Contains([]byte(p.out.String()), []byte(substr)) {
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not log %q within %s:\n%s", p.name, substr, timeout, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// load writes transactions of 1..maxTx events until stop is closed, and
// returns the ids it committed.
type load struct {
	mu   sync.Mutex
	ids  []string
	stop chan struct{}
	done chan struct{}
}

func (b *bundle) startLoad(t *testing.T, aggType string, maxTx int, pause time.Duration) *load {
	l := &load{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			n := 1 + rng.IntN(maxTx)
			events := make([]outbox.Event, n)
			for j := range events {
				events[j] = evt(aggType, "agg-"+strconv.Itoa(rng.IntN(50)), i)
			}
			ids, err := outbox.Write(b.ctx, b.db.Pool, events...)
			if err != nil {
				t.Errorf("load: %v", err)
				return
			}
			l.mu.Lock()
			for _, id := range ids {
				l.ids = append(l.ids, id.String())
			}
			l.mu.Unlock()
			time.Sleep(pause)
		}
	}()
	return l
}

func (l *load) finish() []string {
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ids...)
}

func (l *load) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

func (l *load) waitCount(t *testing.T, n int) {
	deadline := time.Now().Add(time.Minute)
	for l.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("load wrote only %d events in a minute", l.count())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SIGKILL the relay process mid-stream and restart it: no event is missing,
// and the duplicates stay within the in-flight window.
func TestSIGKILLMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 4)
	const window, maxTx = 500, 20
	first := b.startProc(t, "relay-1", "--max-in-flight", strconv.Itoa(window))
	first.waitLog("streaming from slot", time.Minute)

	l := b.startLoad(t, "order", maxTx, 0)
	l.waitCount(t, 3000)
	first.signal(syscall.SIGKILL)
	first.wait(10 * time.Second)
	written := l.count()
	l.waitCount(t, written+2000) // the outbox keeps filling while no relay runs

	second := b.startProc(t, "relay-2", "--max-in-flight", strconv.Itoa(window))
	second.waitLog("streaming from slot", time.Minute)
	l.waitCount(t, l.count()+2000)
	ids := l.finish()

	c := consume(t, []string{topic}, ids, 2*time.Minute, 2*time.Second)
	dups := c.duplicates()
	t.Logf("%d events, %d published twice after SIGKILL (window %d + one transaction of at most %d)", len(ids), dups, window, maxTx)
	if dups > window+maxTx {
		t.Fatalf("%d duplicates after one SIGKILL, more than the in-flight window %d + %d", dups, window, maxTx)
	}
}

// SIGTERM under load: the relay finishes its transaction, waits for Kafka,
// confirms and exits 0; the next relay publishes nothing twice.
func TestSIGTERMUnderLoadExitsCleanly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 4)
	first := b.startProc(t, "relay-1")
	first.waitLog("streaming from slot", time.Minute)

	l := b.startLoad(t, "order", 20, 0)
	l.waitCount(t, 3000)
	first.signal(syscall.SIGTERM)
	if code := first.wait(40 * time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0", code)
	}
	second := b.startProc(t, "relay-2")
	second.waitLog("streaming from slot", time.Minute)
	l.waitCount(t, l.count()+2000)
	ids := l.finish()

	c := consume(t, []string{topic}, ids, 2*time.Minute, 2*time.Second)
	if dups := c.duplicates(); dups != 0 {
		t.Fatalf("%d events published twice across a SIGTERM restart, want 0", dups)
	}
}

// Two relays on one slot: the second waits as a standby and says so; when
// the active one is killed it takes over within 10 s and nothing is lost.
func TestStandbyTakesOverWhenActiveDies(t *testing.T) {
	t.Parallel()
	_, topic, active, standby, l := startActiveAndStandby(t)
	killed := time.Now()
	active.signal(syscall.SIGKILL)
	standby.waitLog("streaming from slot", 10*time.Second)
	t.Logf("standby streaming %s after the active relay was killed", time.Since(killed).Round(time.Millisecond))
	l.waitCount(t, l.count()+1000)
	ids := l.finish()
	consume(t, []string{topic}, ids, 2*time.Minute, 0)
}

// A frozen active relay (SIGSTOP: a stopped process, a partitioned host)
// loses its slot after --server-timeout, which the relay sets as its
// connection's wal_sender_timeout: the standby takes over and everything is
// delivered. Resumed, the frozen relay confirms nothing: the slot stays
// with the standby's connection.
func TestStandbyTakesOverFromAFrozenRelay(t *testing.T) {
	t.Parallel()
	b, topic, active, standby, l := startActiveAndStandby(t)
	frozen := time.Now()
	active.signal(syscall.SIGSTOP)
	// PostgreSQL's own default wal_sender_timeout (60 s) would hold the
	// slot for the frozen relay well past this.
	standby.waitLog("streaming from slot", 30*time.Second)
	t.Logf("standby streaming %s after the active relay froze", time.Since(frozen).Round(time.Millisecond))
	holder := b.slotHolder(t)

	active.signal(syscall.SIGCONT)
	l.waitCount(t, l.count()+1000)
	ids := l.finish()
	consume(t, []string{topic}, ids, 2*time.Minute, 0)
	if now := b.slotHolder(t); now != holder {
		t.Fatalf("the slot moved from the standby's walsender %d to %d after the frozen relay resumed", holder, now)
	}
}

// A frozen server (its walsender stopped) is noticed within
// --server-timeout, not when TCP gives up minutes later: the relay asks for
// a keepalive with every status update and reconnects after silence.
func TestFrozenWalsenderIsNoticed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	relay := b.startProc(t, "relay")
	relay.waitLog("streaming from slot", time.Minute)
	first := b.write(t, evt("order", "a", 1))
	consume(t, []string{topic}, first, time.Minute, 0)

	walsender := b.slotHolder(t)
	if err := syscall.Kill(int(walsender), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP walsender %d: %v", walsender, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(int(walsender), syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	relay.waitLog("replication connection silent", 30*time.Second)
	resume()
	// The relay reconnects, takes the slot back once the old walsender
	// notices its client left, and publishes what was written meanwhile.
	more := b.write(t, evt("order", "a", 2), evt("order", "a", 3))
	consume(t, []string{topic}, append(first, more...), 2*time.Minute, 0)
}

// startActiveAndStandby runs two relay processes on one slot, the second
// standing by, and a load of which 1,000 events are written.
func startActiveAndStandby(t *testing.T) (b *bundle, topic string, active, standby *proc, l *load) {
	b = setup(t)
	topic = b.topic(t, "order", 2)
	active = b.startProc(t, "active", "--max-in-flight", "200")
	active.waitLog("streaming from slot", time.Minute)
	standby = b.startProc(t, "standby", "--max-in-flight", "200")
	standby.waitLog("standby: another relay holds the slot", 30*time.Second)
	l = b.startLoad(t, "order", 10, time.Millisecond)
	l.waitCount(t, 1000)
	return b, topic, active, standby, l
}

// slotHolder is the pid of the walsender streaming the bundle's slot, 0
// when none does.
func (b *bundle) slotHolder(t *testing.T) int32 {
	t.Helper()
	var pid int32
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}
