package relaycli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
)

// Every wrong setting of `relay bridge` is refused at start-up by an
// error that names its flag, and exits 2.
func TestBridgeSettingsAreValidatedByName(t *testing.T) {
	for _, env := range []string{"FERRY_DATABASE_URL", "FERRY_PLAN", "FERRY_TOPICS", "FERRY_TOPIC_MAP"} {
		t.Setenv(env, "")
	}
	db := []string{"--database-url", "postgres://x@127.0.0.1:1/x"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bridge", "--plan", "p", "--topics", "t"}, "FERRY_DATABASE_URL"},
		{append([]string{"bridge", "--topics", "t"}, db...), "--plan"},
		{append([]string{"bridge", "--plan", "p"}, db...), "--topics"},
		{append([]string{"bridge", "--plan", "p", "--topics", "bad topic"}, db...), "--topics"},
		{append([]string{"bridge", "--plan", "p", "--topic-regex", "a["}, db...), "--topic-regex"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--topic-map", "t"}, db...), "--topic-map"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--topic-map", "u=v"}, db...), "--topic-map"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--topic-map", "t=a", "--topic-map", "t=b"}, db...), "--topic-map"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--copy-topic-template", "one"}, db...), "--copy-topic-template"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--id-from", "offset"}, db...), "--id-from"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--id-from", "payload", "--id-header", "x"}, db...), "Config.IDHeader"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--offset-reset", "none"}, db...), "--offset-reset"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--max-in-flight", "0"}, db...), "max-in-flight"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--step-interval", "0s"}, db...), "step-interval"},
		{append([]string{"bridge", "--plan", "p", "--topics", "t", "--topic-check-interval", "0s"}, db...), "topic-check-interval"},
	}
	for _, c := range cases {
		code, _, stderr := run(t, context.Background(), c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("relay %v: exit %d, stderr %q; want exit 2 naming %s", c.args, code, stderr, c.want)
		}
	}
}

// No output of `relay bridge` shows the database's password: not its
// help, not a usage error, not the logs of a run that cannot reach the
// database. (ferrytest.NoSecretShown's variants pass --kafka-* flags, which
// the bridge does not take: its clusters come from the plan.)
func TestBridgeShowsNoSecret(t *testing.T) {
	const secret = "Db-s3cret-4417"
	url := "postgres://ferry:" + secret + "@127.0.0.1:1/ferry?connect_timeout=1"
	t.Setenv("FERRY_DATABASE_URL", url)
	tried := false
	for _, args := range [][]string{
		{"bridge", "-h"},
		{"bridge", "--no-such-flag"},
		{"bridge", "--plan", "p", "--topics", "t", "--log-level", "debug", "--http-addr", "127.0.0.1:0"},
		{"bridge", "--plan", "p", "--topics", "t", "--database-url", "postgres://ferry:" + secret + "@[::1", "--http-addr", "127.0.0.1:0"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		code, stdout, stderr := run(t, ctx, args...)
		cancel()
		all := stdout + stderr
		if strings.Contains(all, secret) {
			t.Errorf("relay %v (exit %d) shows the password:\n%s", args, code, all)
		}
		tried = tried || strings.Contains(all, "127.0.0.1:1")
	}
	if !tried {
		t.Fatal("no run named the database it tried: the test did not exercise the secret")
	}
}

// `relay bridge` copies a plan's old topic to its new one on cluster B,
// ids and stamps included, stops on its context with exit 0, and refuses
// a plan that does not exist by its flag.
func TestBridgeCommandCopies(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	name := dualWritePlan(t, ctx, db, "bridge-cli-"+ferrytest.Suffix())
	oldTopic, newTopic := ferrytest.Topic(t, 2), ferrytest.TopicB(t, 2)
	const n = 10
	for i := range n {
		r := &kgo.Record{Topic: oldTopic, Key: []byte{'k', byte('0' + i)}, Value: []byte("v")}
		if err := ferrytest.Client(t).ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	if code, _, stderr := run(t, ctx, "bridge", "--database-url", db.URL, "--plan", "nope", "--topics", oldTopic, "--http-addr", "off"); code != 2 || !strings.Contains(stderr, "--plan") {
		t.Fatalf("unknown plan: exit %d, %s", code, stderr)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var logs ferrytest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- relaycli.Main(runCtx, []string{"bridge", "--database-url", db.URL, "--plan", name, "--topics", oldTopic,
			"--topic-map", oldTopic + "=" + newTopic, "--log-format", "json", "--http-addr", "off"}, &logs, &logs)
	}()
	adm := ferrytest.AdminB(t)
	for {
		ends, err := adm.ListEndOffsets(ctx, newTopic)
		if err != nil {
			t.Fatal(err)
		}
		var got int64
		ends.Each(func(o kadm.ListedOffset) { got += o.Offset })
		if got >= n {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d records on B\n%s", got, n, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d\n%s", code, logs.String())
	}
	if !strings.Contains(logs.String(), "bridge stopped") {
		t.Fatalf("no stop line in the logs:\n%s", logs.String())
	}

	cl := ferrytest.ClientB(t, kgo.ConsumeTopics(newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	seen := 0
	for seen < n {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d", seen, n)
		}
		f.EachRecord(func(r *kgo.Record) {
			seen++
			var id, stamps []string
			for _, h := range r.Headers {
				switch h.Key {
				case outbox.HeaderID:
					id = append(id, string(h.Value))
				case route.HeaderRoute:
					stamps = append(stamps, string(h.Value))
				}
			}
			if len(id) != 1 || !strings.HasPrefix(id[0], "sha256:") || len(stamps) != 1 || !strings.Contains(stamps[0], "plan="+name+";epoch=1;") {
				t.Errorf("copy %s: ids %q, stamps %q", r.Key, id, stamps)
			}
		})
	}
}

// `relay bridge` on a topic the old cluster does not have says so, at
// every --topic-check-interval until it exists, and /readyz answers 503
// naming it meanwhile; once the topic is created, /readyz answers ok.
func TestBridgeSaysATopicDoesNotExist(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	name := dualWritePlan(t, ctx, db, "m7-"+ferrytest.Suffix())
	missing := "no.such.topic." + ferrytest.Suffix()
	addr := freeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var logs ferrytest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- relaycli.Main(runCtx, []string{"bridge", "--database-url", db.URL, "--plan", name, "--topics", missing,
			"--topic-check-interval", "200ms", "--http-addr", addr, "--log-format", "json"}, &logs, &logs)
	}()
	said := func() int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, "do not exist") && strings.Contains(line, missing) {
				n++
			}
		}
		return n
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case code := <-done:
				t.Fatalf("relay bridge exited %d before %s:\n%s", code, what, logs.String())
			case <-ctx.Done():
				t.Fatalf("no %s:\n%s", what, logs.String())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	wait("two log lines saying "+missing+" does not exist", func() bool { return said() >= 2 })
	status, body := get("http://" + addr + "/readyz")
	if status != 503 || !strings.Contains(body, missing) || !strings.Contains(body, "does not exist") {
		t.Fatalf("/readyz with %s missing: %d %q, want 503 naming it", missing, status, body)
	}
	ferrytest.CreateTopic(t, missing, 1)
	wait("/readyz ok once "+missing+" exists", func() bool { status, _ := get("http://" + addr + "/readyz"); return status == 200 })
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d\n%s", code, logs.String())
	}
}

// dualWritePlan creates a plan named name from cluster A to cluster B for
// the group stock, moves it to DUAL_WRITE and returns its name.
func dualWritePlan(t *testing.T, ctx context.Context, db *ferrytest.DB, name string) string {
	t.Helper()
	c := &migration.Controller{DB: db.Pool}
	if err := c.Create(ctx, migration.Plan{Name: name,
		Old:    migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "outbox.event.{aggregate_type}"},
		New:    migration.Channel{Brokers: ferrytest.BrokersB(t), TopicTemplate: "outbox.event.{aggregate_type}"},
		Groups: []string{"stock"}}, "test"); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Request(ctx, name, migration.DualWrite, 0, "test"); err != nil || !d.Accepted {
		t.Fatalf("DUAL_WRITE: %+v %v", d, err)
	}
	return name
}
