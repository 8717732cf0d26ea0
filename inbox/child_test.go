package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// childEnv, when set to a JSON childConfig, makes the test binary run one
// worker process instead of the tests.
const childEnv = "FERRY_INBOX_CHILD"

type childConfig struct {
	DatabaseURL    string
	Brokers        []string
	Consumer       string
	Topic          string
	Name           string // written into each effect row
	BatchSize      int
	KeyConcurrency int
	// KillAfterCommitID SIGKILLs the process right after the database
	// commit of this message, before its offset can be committed.
	KillAfterCommitID string
	// KillBeforeCommitID SIGKILLs the process right before the database
	// commit of this message.
	KillBeforeCommitID string
	// Unsafe commits offsets before the database (the negative control
	// of UnsafeCommitOffsetsBeforeDB in ferryfault builds).
	Unsafe bool
}

// childMain is a worker process: it applies messages into the effects
// table until SIGTERM, then prints its Stats as JSON on stdout.
func childMain() int {
	var cc childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cc); err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, cc.DatabaseURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	cfg := &Config{
		DB: pool,
		KafkaOpts: []kgo.Opt{
			kgo.SeedBrokers(cc.Brokers...), kgo.FetchMaxWait(250 * time.Millisecond),
			kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond),
		},
		BatchSize:       cc.BatchSize,
		KeyConcurrency:  cc.KeyConcurrency,
		CommitInterval:  200 * time.Millisecond,
		RetryBackoff:    10 * time.Millisecond,
		RetryBackoffMax: 200 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With(slog.String("child", cc.Name)),
	}
	kill := func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	cfg.hooks.afterDBCommit = func(m *Message) {
		if m.ID == cc.KillAfterCommitID {
			kill()
		}
	}
	cfg.hooks.beforeDBCommit = func(m *Message) {
		if m.ID == cc.KillBeforeCommitID {
			kill()
		}
	}
	if cc.Unsafe {
		cfg.unsafeCommitBeforeDB = true
	}
	w, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w.Handle(cc.Consumer, cc.Topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		return insertEffect(ctx, tx, m, cc.Name)
	})
	runErr := w.Run(ctx)
	_ = json.NewEncoder(os.Stdout).Encode(w.Stats())
	if runErr != nil {
		fmt.Fprintln(os.Stderr, runErr)
		return 1
	}
	return 0
}

// child is a worker process started by a test.
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdout bytes.Buffer
	done   chan struct{}
	state  *os.ProcessState
}

func (b *bundle) startChild(cc childConfig) *child {
	b.t.Helper()
	cc.DatabaseURL, cc.Brokers, cc.Consumer, cc.Topic = b.db.URL, ferrytest.Brokers(b.t), b.consumer, b.topic
	js, err := json.Marshal(cc)
	if err != nil {
		b.t.Fatal(err)
	}
	c := &child{t: b.t, name: cc.Name, done: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0])
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	c.cmd.Stdout = &c.stdout
	c.cmd.Stderr = &prefixWriter{w: &testWriter{t: b.t}, prefix: "child " + cc.Name + ": "}
	if err := c.cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		c.state = c.cmd.ProcessState
		close(c.done)
	}()
	b.t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// wait waits for the process to exit and returns how it did.
func (c *child) wait(ctx context.Context) *os.ProcessState {
	c.t.Helper()
	select {
	case <-c.done:
		return c.state
	case <-ctx.Done():
		c.t.Fatalf("child %s did not exit", c.name)
		return nil
	}
}

func (c *child) signal(s os.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(s); err != nil {
		c.t.Fatalf("signal child %s: %v", c.name, err)
	}
}

// terminate sends SIGTERM and checks the worker drained and exited 0.
func (c *child) terminate(ctx context.Context) Stats {
	c.t.Helper()
	c.signal(syscall.SIGTERM)
	st := c.wait(ctx)
	if st.ExitCode() != 0 {
		c.t.Fatalf("child %s exited with %v after SIGTERM, want 0", c.name, st)
	}
	var stats Stats
	if err := json.Unmarshal(c.stdout.Bytes(), &stats); err != nil {
		c.t.Fatalf("child %s stats %q: %v", c.name, c.stdout.String(), err)
	}
	return stats
}

func killedBySIGKILL(st *os.ProcessState) bool {
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

type prefixWriter struct {
	mu     sync.Mutex
	w      *testWriter
	prefix string
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		_, _ = p.w.Write([]byte(p.prefix + line))
	}
	return len(b), nil
}

// A worker process SIGKILLed after the database commit and before the
// offset commit gets the message again after a restart, and the inbox
// keeps its effect single.
func TestKilledAfterDatabaseCommitEffectStaysSingle(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(b.record("m-1", "k", 0, 1), b.record("m-2", "k", 0, 2))

	// One message per transaction: the kill falls between m-1's commit and
	// m-2's.
	a := b.startChild(childConfig{Name: "A", KillAfterCommitID: "m-1", BatchSize: 1})
	if st := a.wait(b.ctx); !killedBySIGKILL(st) {
		t.Fatalf("child A: %v, want killed by SIGKILL in the hook", st)
	}
	if n := b.effects("m-1"); n != 1 {
		t.Fatalf("m-1 has %d effects after the kill, want 1 (committed before the kill)", n)
	}
	if got := b.committed(b.consumer, 0); got >= 1 {
		t.Fatalf("offset %d committed: the kill must come before the offset commit", got)
	}

	c := b.startChild(childConfig{Name: "B"})
	b.waitCommitted(b.consumer, 0, 2)
	stats := c.terminate(b.ctx)
	if stats.Duplicates != 1 || stats.Processed != 1 {
		t.Errorf("restarted worker: %+v, want m-1 again as 1 duplicate and m-2 processed", stats)
	}
	if n := b.effects("m-1"); n != 1 {
		t.Errorf("m-1 has %d effects, want 1", n)
	}
	if n := b.effects("m-2"); n != 1 {
		t.Errorf("m-2 has %d effects, want 1", n)
	}
}

// The negative control: a worker that commits the offset before the
// database loses the effect of a message it crashes on. The same check
// that passes above (count effects per id) catches it, so that check can
// see a loss.
func TestNegativeControlCommitBeforeDatabaseLosesEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(b.record("m-1", "k", 0, 1), b.record("m-2", "k", 0, 2))

	a := b.startChild(childConfig{Name: "A", Unsafe: true, KillBeforeCommitID: "m-1", BatchSize: 1})
	if st := a.wait(b.ctx); !killedBySIGKILL(st) {
		t.Fatalf("child A: %v, want killed by SIGKILL in the hook", st)
	}
	if got := b.committed(b.consumer, 0); got != 1 {
		t.Fatalf("committed offset %d, want 1: the unsafe worker commits before its transaction", got)
	}

	c := b.startChild(childConfig{Name: "B"})
	b.waitCommitted(b.consumer, 0, 2)
	c.terminate(b.ctx)
	if n := b.effects("m-2"); n != 1 {
		t.Errorf("m-2 has %d effects, want 1", n)
	}
	if n := b.effects("m-1"); n != 0 {
		t.Fatalf("m-1 has %d effects: the negative control did not lose it", n)
	}
}

// Two worker processes, one joining and one SIGKILLed while 10,000 messages
// flow: every message has exactly one effect, and each key's effects are in
// the order its messages were written.
func TestTwoProcessesJoinAndKillWhileMessagesFlow(t *testing.T) {
	t.Parallel()
	const total, keys = 10_000, 500
	b := setup(t, 4)
	producer := ferrytest.Client(t) // partitions by key, as the relay does
	cc := childConfig{BatchSize: 16, KeyConcurrency: 2}

	cc.Name = "A"
	a := b.startChild(cc)
	produced := make(chan error, 1)
	go func() {
		const chunk = 100
		for start := 0; start < total; start += chunk {
			recs := make([]*kgo.Record, 0, chunk)
			for i := start; i < start+chunk; i++ {
				recs = append(recs, b.record(fmt.Sprintf("m-%05d", i), fmt.Sprintf("k%03d", i%keys), 0, i/keys))
			}
			if err := producer.ProduceSync(b.ctx, recs...).FirstErr(); err != nil {
				produced <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		produced <- nil
	}()
	applied := func() int { return b.count(`SELECT count(*) FROM effects`) }

	b.waitFor("2,000 effects", func() (bool, error) { return applied() >= 2000, nil })
	cc.Name = "B"
	c := b.startChild(cc)
	b.waitFor("5,000 effects", func() (bool, error) { return applied() >= 5000, nil })
	a.signal(syscall.SIGKILL)
	a.wait(b.ctx)
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	b.waitFor("every message applied and committed", func() (bool, error) {
		if b.count(`SELECT count(DISTINCT message_id) FROM effects`) < total {
			return false, nil
		}
		return b.committedTotal(b.consumer) == total, nil
	})
	c.terminate(b.ctx)

	if n := b.count(`SELECT count(*) FROM (SELECT message_id FROM effects GROUP BY message_id HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d messages with more than one effect", n)
	}
	if n := b.count(`SELECT count(DISTINCT message_id) FROM effects`); n != total {
		t.Errorf("%d messages applied, want %d", n, total)
	}
	if n := b.count(`SELECT count(*) FROM (
		SELECT seq, lag(seq) OVER (PARTITION BY key ORDER BY n) AS prev FROM effects) s
		WHERE prev IS NOT NULL AND seq <= prev`); n != 0 {
		t.Errorf("%d effects applied out of their key's order", n)
	}
	if n := b.count(`SELECT count(DISTINCT worker) FROM effects`); n != 2 {
		t.Errorf("effects made by %d workers, want both", n)
	}
}

// committedTotal sums the group's committed offsets over the topic.
func (b *bundle) committedTotal(group string) int64 {
	b.t.Helper()
	offs, err := ferrytest.Admin(b.t).FetchOffsets(b.ctx, group)
	if err != nil {
		return 0
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == b.topic && o.Err == nil {
			sum += o.At
		}
	})
	return sum
}
