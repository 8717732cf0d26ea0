package relaycli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
)

// migrationSetup is a migrated database of the test's own and a way to run
// `relay migration ...` on it.
type migrationSetup struct {
	db  *ferrytest.DB
	ctx context.Context
}

func newMigrationSetup(t *testing.T) *migrationSetup {
	t.Helper()
	return &migrationSetup{db: ferrytest.NewMigratedDB(t), ctx: ferrytest.Context(t, time.Minute)}
}

// relay runs `relay migration args... --database-url <its database>`: the
// flag after the arguments, as an operator may write it.
func (s *migrationSetup) relay(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return run(t, s.ctx, append(append([]string{"migration"}, args...), "--database-url", s.db.URL)...)
}

// must is relay that fails the test unless the command exits want.
func (s *migrationSetup) must(t *testing.T, want int, args ...string) (stdout, stderr string) {
	t.Helper()
	code, stdout, stderr := s.relay(t, args...)
	if code != want {
		t.Fatalf("relay migration %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, stdout, stderr)
	}
	return stdout, stderr
}

// createArgs create plan name with a plain old channel and a new one behind
// TLS and SCRAM, whose password is in the variable passEnv.
func createArgs(name, passEnv string, extra ...string) []string {
	return append([]string{"create", name,
		"--old-brokers", "a:9092", "--old-topic-template", "outbox.event.{aggregate_type}",
		"--new-brokers", "b:9092, c:9092", "--new-topic-template", "outbox.event.{aggregate_type}",
		"--new-tls", "--new-tls-ca-file", "/etc/ferry/ca.pem",
		"--new-sasl-mechanism", "scram-sha-512", "--new-sasl-username", "ferry", "--new-sasl-password-env", passEnv,
		"--groups", "stock,billing"}, extra...)
}

// rabbitArgs create plan name from a RabbitMQ channel to a Kafka one.
func rabbitArgs(name string) []string {
	return []string{"create", name,
		"--old-kind", "rabbitmq", "--old-url", "amqp://ferry@mq:5672/prod", "--old-password-env", "FERRY_OLD_RABBITMQ_PASSWORD",
		"--old-topic-template", "outbox.event.{aggregate_type}",
		"--new-brokers", "b:9092", "--new-topic-template", "outbox.event.{aggregate_type}", "--groups", "stock"}
}

// A plan between brokers of different kinds, from the command line:
// stored as given, in either direction, with the default shard count
// when none is given, and shown by status without a secret.
func TestMigrationCreateTakesChannelsOfEitherKind(t *testing.T) {
	const secret = "Rabbit-s3cret-4417"
	t.Setenv("FERRY_OLD_RABBITMQ_PASSWORD", secret)
	s := newMigrationSetup(t)
	s.must(t, 0, rabbitArgs("from-rabbit")...)
	s.must(t, 0, "create", "to-rabbit", "--old-brokers", "a:9092", "--old-topic-template", "outbox.event.{aggregate_type}",
		"--new-kind", "RabbitMQ", "--new-url", "amqps://ferry@mq:5671/prod", "--new-tls-ca-file", "/etc/ferry/ca.pem",
		"--new-password-env", "FERRY_NEW_RABBITMQ_PASSWORD", "--new-shards", "32",
		"--new-topic-template", "outbox.event.{aggregate_type}", "--groups", "stock")
	c := &migration.Controller{DB: s.db.Pool}
	kafka := func(b string) migration.Channel {
		return migration.Channel{Brokers: []string{b}, TopicTemplate: "outbox.event.{aggregate_type}"}
	}
	for name, want := range map[string][2]migration.Channel{
		"from-rabbit": {{Kind: migration.RabbitMQ, URL: "amqp://ferry@mq:5672/prod", PasswordEnv: "FERRY_OLD_RABBITMQ_PASSWORD",
			Shards: 16, TopicTemplate: "outbox.event.{aggregate_type}"}, kafka("b:9092")},
		"to-rabbit": {kafka("a:9092"), {Kind: migration.RabbitMQ, URL: "amqps://ferry@mq:5671/prod", TLSCAFile: "/etc/ferry/ca.pem",
			PasswordEnv: "FERRY_NEW_RABBITMQ_PASSWORD", Shards: 32, TopicTemplate: "outbox.event.{aggregate_type}"}},
	} {
		st, err := c.State(s.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(st.Plan.Old, want[0]) || !reflect.DeepEqual(st.Plan.New, want[1]) {
			t.Errorf("plan %s stored %+v -> %+v, want %+v -> %+v", name, st.Plan.Old, st.Plan.New, want[0], want[1])
		}
	}
	out, _ := s.must(t, 0, "status", "to-rabbit", "--old-channel-timeout", "1s")
	for _, line := range []string{"rabbitmq url amqps://ferry@mq:5671/prod", "exchange template outbox.event.{aggregate_type}, 32 shards",
		"tls on, ca file /etc/ferry/ca.pem", "password from $FERRY_NEW_RABBITMQ_PASSWORD", "brokers a:9092"} {
		if !strings.Contains(out, line) {
			t.Errorf("status of to-rabbit does not say %q:\n%s", line, out)
		}
	}
	out, stderr := s.must(t, 0, "status", "from-rabbit", "--old-channel-timeout", "1s")
	if strings.Contains(out+stderr, secret) || !strings.Contains(out, "password from $FERRY_OLD_RABBITMQ_PASSWORD") {
		t.Errorf("status of from-rabbit shows the password, or not its variable:\n%s\n%s", out, stderr)
	}
}

// tableRows are the lines of a table after its header, up to the first
// empty line.
func tableRows(t *testing.T, out, header string) []string {
	t.Helper()
	_, table, ok := strings.Cut(out, header)
	if !ok {
		t.Fatalf("no table headed %q in:\n%s", header, out)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	return lines[1:] // the rest of the header line
}

// A plan's life from the command line: create stores the channels and
// groups as given; DUAL_WRITE is accepted (exit 0); CUTOVER without any
// evidence is rejected (exit 1, the reason on stderr) and recorded as
// such; a forbidden transition and slices asked of DUAL_WRITE are rejected
// the same way; OLD_ONLY (abandon) is accepted; history lists every
// request with who asked and the decision; status shows the phase, the
// epoch and the last requests.
func TestMigrationRequestsAreDecidedRecordedAndExitByDecision(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	out, _ := s.must(t, 0, createArgs("move-1", "FERRY_NEW_SASL_PASSWORD", "--by", "alice@ops")...)
	if !strings.Contains(out, "created plan move-1 in OLD_ONLY") {
		t.Fatalf("create says:\n%s", out)
	}
	st, err := (&migration.Controller{DB: s.db.Pool}).State(s.ctx, "move-1")
	if err != nil {
		t.Fatal(err)
	}
	want := migration.Plan{Name: "move-1", Groups: []string{"stock", "billing"},
		Old: migration.Channel{Brokers: []string{"a:9092"}, TopicTemplate: "outbox.event.{aggregate_type}"},
		New: migration.Channel{Brokers: []string{"b:9092", "c:9092"}, TopicTemplate: "outbox.event.{aggregate_type}",
			TLS: true, TLSCAFile: "/etc/ferry/ca.pem",
			SASLMechanism: "SCRAM-SHA-512", SASLUsername: "ferry", SASLPasswordEnv: "FERRY_NEW_SASL_PASSWORD"}}
	if !reflect.DeepEqual(st.Plan, want) || st.Phase != migration.OldOnly || st.Epoch != 0 {
		t.Fatalf("stored plan %+v in %s epoch %d;\nwant %+v in OLD_ONLY epoch 0", st.Plan, st.Phase, st.Epoch, want)
	}
	if code, _, stderr := s.relay(t, createArgs("move-1", "FERRY_NEW_SASL_PASSWORD")...); code != 1 || !strings.Contains(stderr, "exists already") {
		t.Fatalf("create of a plan that exists: exit %d, %q; want 1 and why", code, stderr)
	}

	out, _ = s.must(t, 0, "request", "move-1", "dual_write", "--by", "bob@ops")
	if !strings.Contains(out, "request 1: OLD_ONLY -> DUAL_WRITE") || !strings.Contains(out, "accepted, epoch 1") {
		t.Fatalf("request DUAL_WRITE says:\n%s", out)
	}
	out, stderr := s.must(t, 1, "request", "move-1", "CUTOVER", "--slices", "6", "--by", "bob@ops")
	if !strings.Contains(out, "rejected (epoch 1 unchanged)") || !strings.Contains(stderr, "shadow gate not passed: group stock") {
		t.Fatalf("request CUTOVER without a report from the group:\nstdout:\n%s\nstderr:\n%s", out, stderr)
	}
	_, stderr = s.must(t, 1, "request", "move-1", "DUAL_WRITE", "--slices", "5", "--by", "carol@ops")
	if !strings.Contains(stderr, "slices apply to CUTOVER only") {
		t.Fatalf("request DUAL_WRITE --slices 5: %s", stderr)
	}
	out, _ = s.must(t, 0, "request", "move-1", "OLD_ONLY", "--by", "bob@ops")
	if !strings.Contains(out, "accepted, epoch 2") || !strings.Contains(out, "abandon") {
		t.Fatalf("request OLD_ONLY (abandon) says:\n%s", out)
	}
	_, stderr = s.must(t, 1, "request", "move-1", "OLD_RETIRED", "--by", "carol@ops")
	if !strings.Contains(stderr, "forbidden: OLD_ONLY -> OLD_RETIRED") {
		t.Fatalf("request OLD_RETIRED from OLD_ONLY: %s", stderr)
	}

	out, _ = s.must(t, 0, "history", "move-1")
	rows := tableRows(t, out, "ID ")
	wantRows := [][]string{
		{"1 ", "bob@ops", "OLD_ONLY", "DUAL_WRITE", "accepted"},
		{"2 ", "bob@ops", "DUAL_WRITE", "CUTOVER 6/128", "rejected", "shadow gate not passed"},
		{"3 ", "carol@ops", "DUAL_WRITE 5/128", "rejected", "slices apply to CUTOVER only"},
		{"4 ", "bob@ops", "DUAL_WRITE", "OLD_ONLY", "accepted", "abandon"},
		{"5 ", "carol@ops", "OLD_ONLY", "OLD_RETIRED", "rejected", "forbidden"},
	}
	if len(rows) != len(wantRows) {
		t.Fatalf("history has %d requests, want %d:\n%s", len(rows), len(wantRows), out)
	}
	for i, parts := range wantRows {
		for _, p := range parts {
			if !strings.Contains(rows[i], p) {
				t.Errorf("history row %d %q lacks %q", i+1, rows[i], p)
			}
		}
	}

	out, _ = s.must(t, 0, "status", "move-1")
	for _, line := range []string{"phase   OLD_ONLY", "slices  0 of 128 moved", "epoch   2",
		"new     brokers b:9092,c:9092", "new     tls on, ca file /etc/ferry/ca.pem",
		"new     sasl SCRAM-SHA-512, user ferry, password from $FERRY_NEW_SASL_PASSWORD",
		"old     tls off", "old     sasl off", "groups  stock, billing", "requests (the last 5 of 5)"} {
		if !strings.Contains(out, line) {
			t.Errorf("status lacks %q:\n%s", line, out)
		}
	}

	if code, _, stderr := s.relay(t, "status", "nope"); code != 1 || !strings.Contains(stderr, "no such plan") {
		t.Fatalf("status of an unknown plan: exit %d, %q", code, stderr)
	}
	if code, _, stderr := s.relay(t, "history", "nope"); code != 1 || !strings.Contains(stderr, "no such plan") {
		t.Fatalf("history of an unknown plan: exit %d, %q", code, stderr)
	}
	if code, _, stderr := s.relay(t, "request", "nope", "DUAL_WRITE"); code != 1 || !strings.Contains(stderr, "no such plan") {
		t.Fatalf("request of an unknown plan: exit %d, %q", code, stderr)
	}
}

// status shows the last five requests only, the newest last.
func TestMigrationStatusShowsTheLastRequests(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	s.must(t, 0, createArgs("move-1", "NEW_PASS")...)
	for i := 0; i < 7; i++ {
		s.must(t, 1, "request", "move-1", "OLD_ONLY") // already there: rejected, recorded
	}
	out, _ := s.must(t, 0, "status", "move-1")
	rows := tableRows(t, out, "ID ")
	if !strings.Contains(out, "requests (the last 5 of 7)") || len(rows) != 5 ||
		!strings.HasPrefix(rows[0], "3 ") || !strings.HasPrefix(rows[4], "7 ") {
		t.Fatalf("status shows requests:\n%s", out)
	}
}

// list shows every plan, oldest first, with its phase, slices and epoch;
// without --by, who asks is user@host.
func TestMigrationListAndDefaultBy(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	out, _ := s.must(t, 0, "list")
	if rows := tableRows(t, out, "NAME "); len(rows) != 0 {
		t.Fatalf("list of no plans:\n%s", out)
	}
	s.must(t, 0, createArgs("move-1", "NEW_PASS")...)
	s.must(t, 0, "create", "move-2", "--old-brokers", "a:9092", "--old-topic-template", "t.{aggregate_type}",
		"--new-brokers", "a:9092", "--new-topic-template", "t2.{aggregate_type}", "--groups", "stock")
	s.must(t, 0, "request", "move-1", "DUAL_WRITE")
	out, _ = s.must(t, 0, "list")
	rows := tableRows(t, out, "NAME ")
	if len(rows) != 2 || strings.Join(strings.Fields(rows[0])[:4], " ") != "move-1 DUAL_WRITE 0/128 1" ||
		strings.Join(strings.Fields(rows[1])[:4], " ") != "move-2 OLD_ONLY 0/128 0" {
		t.Fatalf("list:\n%s", out)
	}

	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	who := os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	out, _ = s.must(t, 0, "history", "move-1")
	if rows := tableRows(t, out, "ID "); len(rows) != 1 || !strings.Contains(rows[0], " "+who+"@"+host+" ") {
		t.Fatalf("history of a request without --by, want %s@%s:\n%s", who, host, out)
	}
}

// What the database holds is shown escaped: a control sequence in a topic
// template or in who asked cannot drive the terminal. create refuses such
// a template, and its refusal is escaped too; one stored by other means
// (an UPDATE by hand) is shown escaped.
func TestMigrationOutputEscapesStoredText(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	const evil = "\x1b]0;pwned\a\x1b[2J"
	_, stderr := s.must(t, 2, "create", "move-1", "--old-brokers", "a:9092", "--old-topic-template", "t.{aggregate_type}",
		"--new-brokers", "b:9092", "--new-topic-template", "t."+evil+"{aggregate_type}", "--groups", "stock", "--by", "x")
	if strings.ContainsAny(stderr, "\x1b\a") || !strings.Contains(stderr, `\x1b]0;pwned\a`) {
		t.Errorf("create's refusal of a template with control bytes shows them unescaped, or not at all:\n%q", stderr)
	}
	s.must(t, 0, "create", "move-1", "--old-brokers", "a:9092", "--old-topic-template", "t.{aggregate_type}",
		"--new-brokers", "b:9092", "--new-topic-template", "t2.{aggregate_type}", "--groups", "stock", "--by", "x")
	if _, err := s.db.Pool.Exec(s.ctx, `UPDATE ferry_migration SET new_channel = jsonb_set(new_channel, '{topic_template}', to_jsonb($1::text))`,
		"t."+evil+"{aggregate_type}"); err != nil {
		t.Fatal(err)
	}
	s.must(t, 0, "request", "move-1", "DUAL_WRITE", "--by", "eve"+evil)
	for _, verb := range []string{"status", "history"} {
		out, _ := s.must(t, 0, verb, "move-1")
		if strings.ContainsAny(out, "\x1b\a") || !strings.Contains(out, `\x1b]0;pwned\a`) {
			t.Errorf("%s shows stored text unescaped, or not at all:\n%q", verb, out)
		}
	}
}

// A wrong command line is refused before the database is reached (it
// cannot be, here: exit 1) with exit 2 and an error naming what is wrong.
// There is no flag for a password: only the name of its variable, and a
// value that is no variable name is refused without being repeated.
func TestMigrationCommandLineIsValidatedByName(t *testing.T) {
	t.Parallel()
	const secret = "Sasl-s3cret-5521!"
	without := func(full []string, drop string, extra ...string) []string {
		var args []string
		for i := 0; i < len(full); i++ {
			if full[i] == drop {
				i++ // and its value
				continue
			}
			args = append(args, full[i])
		}
		return append(args, extra...)
	}
	create := func(drop string, extra ...string) []string {
		return without(createArgs("move-1", "NEW_PASS"), drop, extra...)
	}
	rabbit := func(drop string, extra ...string) []string { return without(rabbitArgs("move-1"), drop, extra...) }
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "relay migration create"},
		{[]string{"sideways"}, "relay migration create"},
		{[]string{"create", "--groups", "g"}, "needs NAME"},
		{create("--groups"), "--groups is required"},
		{create("", "--groups", " , "), "--groups is required"},
		{create("--old-brokers"), "--old-brokers is required"},
		{create("--new-topic-template"), "--new-topic-template is required"},
		{create("", "--new-brokers", "nohost"), "--new-brokers"},
		// What `relay run --topic-template` refuses, refused by the same check.
		{create("", "--new-topic-template", "outbox.{aggregate_type"), `--new-topic-template "outbox.{aggregate_type"`},
		{create("", "--new-topic-template", "outbox.{foo}"), "--new-topic-template \"outbox.{foo}\": unknown placeholder {foo}"},
		{create("", "--old-topic-template", "outbox}.{aggregate_type}}"), `--old-topic-template "outbox}.{aggregate_type}}"`},
		{create("", "--old-tls-ca-file", "/ca.pem"), "--old-tls"},
		{create("", "--new-tls-cert-file", "/c.pem"), "--new-tls-key-file"},
		{create("", "--new-sasl-mechanism", "MD5"), "--new-sasl-mechanism"},
		{create("--new-sasl-username"), "--new-sasl-username"},
		{create("--new-sasl-password-env"), "--new-sasl-password-env"},
		{create("", "--old-sasl-username", "u"), "--old-sasl-mechanism"},
		{create("", "--new-sasl-password-env", secret), "--new-sasl-password-env takes the NAME"},
		{create("", "--new-sasl-password", secret), "-new-sasl-password"},
		{create("", "--old-sasl-password="+secret), "-old-sasl-password"},
		{create("", "--by", ""), "--by"},
		{create("", "--new-kind", "nats"), `--new-kind "nats": want kafka or rabbitmq`},
		{create("", "--old-shards", "8"), "--old-shards: RabbitMQ settings, and the old channel is Kafka"},
		{create("", "--new-url", "amqp://u@h:5672/"), "--new-url: RabbitMQ settings"},
		{rabbit("--old-url"), "--old-url is required"},
		{rabbit("", "--old-brokers", "a:9092"), "--old-brokers: Kafka settings, and the old channel is RabbitMQ"},
		{rabbit("", "--old-tls"), "--old-tls: Kafka settings"},
		{rabbit("", "--old-shards", "12"), "--old-shards: 12 is not a power of two"},
		{rabbit("", "--old-url", "amqp://u:"+secret+"@h:5672/"), "--old-url carries a password: put it in --old-password-env"},
		{rabbit("", "--old-url", "http://h:5672/"), `--old-url: scheme "http"`},
		{rabbit("", "--old-tls-ca-file", "/ca.pem"), "need an amqps:// URL"},
		{rabbit("", "--old-password-env", secret), "--old-password-env takes the NAME"},
		{[]string{"request", "move-1"}, "needs NAME PHASE"},
		{[]string{"request", "move-1", "SIDEWAYS"}, `PHASE "SIDEWAYS"`},
		{[]string{"request", "move-1", "CUTOVER", "--slices", "many"}, "-slices"},
		{[]string{"request", "move-1", "CUTOVER", "extra"}, `unexpected argument "extra"`},
		{[]string{"status"}, "needs NAME"},
		{[]string{"history", "a", "b"}, `unexpected argument "b"`},
		{[]string{"list", "everything"}, `unexpected argument "everything"`},
	} {
		args := append(append([]string{"migration"}, c.args...), "--database-url", "postgres://x@127.0.0.1:1/x?connect_timeout=1")
		code, stdout, stderr := run(t, context.Background(), args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("relay %q: exit %d, stderr %q; want exit 2 naming %s", args, code, stderr, c.want)
		}
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("relay %q shows the password:\n%s\n%s", args, stdout, stderr)
		}
	}
}

// No output of `relay migration` shows a secret: the SASL password of a
// channel, present in the environment under the name the plan holds, nor a
// database password, whether the database answers or not.
func TestMigrationShowsNoSecret(t *testing.T) {
	const saslSecret, dbSecret = "Sasl-s3cret-9902", "Db-s3cret-7731"
	t.Setenv("FERRY_TEST_MIGRATION_NEW_PASS", saslSecret)
	s := newMigrationSetup(t)
	check := func(args []string, code int, out string) {
		t.Helper()
		for _, secret := range []string{saslSecret, dbSecret} {
			if strings.Contains(out, secret) {
				t.Errorf("relay migration %s (exit %d) shows a secret:\n%s", strings.Join(args, " "), code, out)
			}
		}
	}
	commands := [][]string{
		createArgs("move-1", "FERRY_TEST_MIGRATION_NEW_PASS"), {"list"}, {"status", "move-1"},
		{"request", "move-1", "DUAL_WRITE"}, {"request", "move-1", "CUTOVER", "--slices", "8"}, {"history", "move-1"},
	}
	statusShown := false
	for _, args := range commands {
		code, stdout, stderr := s.relay(t, args...)
		check(args, code, stdout+stderr)
		statusShown = statusShown || strings.Contains(stdout, "password from $FERRY_TEST_MIGRATION_NEW_PASS")
	}
	if !statusShown {
		t.Fatal("status did not name the password variable: the test did not see the channel's SASL settings")
	}

	unreachable := "postgres://ferry:" + dbSecret + "@127.0.0.1:1/ferry?connect_timeout=1"
	for _, args := range commands {
		for _, extra := range [][]string{
			{"--database-url", unreachable}, {"--database-url", "postgres://ferry:" + dbSecret + "@[::1"}, {"-h"},
		} {
			args := append(append([]string{"migration"}, args...), extra...)
			code, stdout, stderr := run(t, s.ctx, args...)
			check(args, code, stdout+stderr)
			if extra[0] == "--database-url" && extra[1] == unreachable && !strings.Contains(stderr, "127.0.0.1:1") {
				t.Errorf("relay %s (exit %d) did not name the database it tried: the password did not reach it\n%s",
					strings.Join(args, " "), code, stderr)
			}
		}
	}
}

// publishReports writes reports to the reports topic of cluster A, as a
// worker does: keyed plan/group, in the compacted topic the first report
// of a cluster creates.
func publishReports(t *testing.T, ctx context.Context, reports ...migration.Report) {
	t.Helper()
	cl := ferrytest.Client(t)
	_, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": new("compact")}, migration.ReportTopic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("create %s: %v", migration.ReportTopic, err)
	}
	for _, r := range reports {
		v, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: migration.ReportTopic, Key: []byte(r.Key()), Value: v}).FirstErr(); err != nil {
			t.Fatalf("publish report %s: %v", r.Key(), err)
		}
	}
}

// rowOf is the row of a table whose first cell is first.
func rowOf(t *testing.T, out, header, first string) []string {
	t.Helper()
	for _, row := range tableRows(t, out, header) {
		if f := strings.Fields(row); len(f) > 0 && f[0] == first {
			return f
		}
	}
	t.Fatalf("no row %s in the table headed %q:\n%s", first, header, out)
	return nil
}

// status reads the old channel (cluster A): each group's newest report
// with the shadow gate's verdict, the one `request` then gives (a group
// whose report shows a mismatch fails, and CUTOVER is rejected naming it;
// once its report passes, CUTOVER is accepted), with the same
// --report-max-age; a group that reported on the plan without being one of
// its groups shows escaped; and the distinct producers of the topics the
// plan's groups committed offsets on, two idempotent ones and an unknown
// one, each with its records, and what to do with them.
func TestMigrationStatusShowsReportsGateAndProducers(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	plan, stock, billing := "move-"+ferrytest.Suffix(), ferrytest.Name(t, "stock"), ferrytest.Name(t, "billing")
	s.must(t, 0, "create", plan, "--old-brokers", strings.Join(ferrytest.Brokers(t), ","), "--old-topic-template", "t.{aggregate_type}",
		"--new-brokers", strings.Join(ferrytest.BrokersB(t), ","), "--new-topic-template", "t.{aggregate_type}", "--groups", stock+","+billing)
	s.must(t, 0, "request", plan, "DUAL_WRITE")

	topic := ferrytest.Topic(t, 2)
	a, b, anon := ferrytest.Client(t), ferrytest.Client(t), ferrytest.Client(t, kgo.DisableIdempotentWrite())
	for _, w := range []struct {
		cl *kgo.Client
		n  int
	}{{a, 3}, {b, 1}, {anon, 2}} {
		for i := range w.n {
			if err := w.cl.ProduceSync(s.ctx, &kgo.Record{Topic: topic, Key: []byte{byte('a' + i)}, Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := ferrytest.Admin(t).CommitAllOffsets(s.ctx, stock, kadm.Offsets{topic: {0: {Topic: topic, Partition: 0, At: 1, LeaderEpoch: -1}}}); err != nil {
		t.Fatal(err)
	}

	const evil = "\x1b]0;pwned\a"
	passing := migration.Report{Plan: plan, Group: stock, At: time.Now().UTC(), Authoritative: 40, Shadow: 38, Checked: 37, Aged: 30,
		AllowedLateness: time.Minute, P99Lateness: 20 * time.Millisecond, MaxLateness: 1500 * time.Millisecond, OldFenceEpoch: 1}
	passing.DuplicatesOld = 2
	mismatch := passing
	mismatch.Group, mismatch.Mismatched, mismatch.Quarantined = billing, 1, 2
	stranger := passing
	stranger.Group = "x" + evil
	publishReports(t, s.ctx, passing, mismatch, stranger)

	out, _ := s.must(t, 0, "status", plan)
	if got := rowOf(t, out, "GROUP ", stock); strings.Join(got[2:14], " ") != "40 38 37 0 0 20ms 1.5s 2 0 1 0 0" || got[14] != "passes" {
		t.Errorf("stock's report: %q; want its numbers and passes:\n%s", got, out)
	}
	if got := strings.Join(rowOf(t, out, "GROUP ", billing), " "); !strings.Contains(got, " 1 20ms 1.5s 2 0 1 2 0 fails: 1 payload mismatches") {
		t.Errorf("billing's report: %q; want a mismatch, 2 quarantined and the gate failing:\n%s", got, out)
	}
	if strings.Contains(out, evil) || !strings.Contains(out, `"x\x1b]0;pwned\a"`) || !strings.Contains(out, "not a group of the plan") {
		t.Errorf("a group that is not the plan's shows unescaped, or not at all:\n%q", out)
	}
	// stock committed offset 1 of partition 0 of the old channel's topic,
	// and nothing on the new channel; billing nothing anywhere.
	ends, err := ferrytest.Admin(t).ListEndOffsets(s.ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var end int64
	ends.Each(func(o kadm.ListedOffset) { end += o.Offset })
	if got := rowOf(t, out, "lag of the groups", stock); strings.Join(got[1:], " ") != fmt.Sprintf("%d 0", end-1) {
		t.Errorf("stock's lag per channel: %q, want %d on the old channel (of %d records) and 0 on the new:\n%s", got, end-1, end, out)
	}
	if got := rowOf(t, out, "TOPIC  ", topic); strings.Join(got[1:], " ") != "2 yes 6" {
		t.Errorf("producers of %s: %q; want 2 distinct, unknown ones, 6 records:\n%s", topic, got, out)
	}
	var ids, records []string
	for _, row := range tableRows(t, out, "PRODUCER_ID") {
		if f := strings.Fields(row); len(f) > 2 && f[0] == topic {
			ids, records = append(ids, f[1]), append(records, f[2])
		}
	}
	if len(ids) != 3 || ids[0] == ids[1] || ids[2] != "unknown" || records[2] != "2" ||
		!slices.Equal(slices.Sorted(slices.Values(records[:2])), []string{"1", "3"}) {
		t.Errorf("producers of %s: ids %v with records %v; want two ids (3 and 1 records), then unknown with 2:\n%s", topic, ids, records, out)
	}
	for _, line := range []string{"in the topics in which " + stock + ", " + billing + ", ferry-bridge-" + plan + " committed offsets",
		"(the last 24h0m0s, --producers-window)", "must move to the new channel (or be bridged: relay bridge) before OLD_RETIRED"} {
		if !strings.Contains(out, line) {
			t.Errorf("status lacks %q:\n%s", line, out)
		}
	}

	_, stderr := s.must(t, 1, "request", plan, "CUTOVER", "--slices", "6")
	if !strings.Contains(stderr, "group "+billing) || strings.Contains(stderr, "group "+stock) {
		t.Fatalf("CUTOVER with billing's gate failing: %s", stderr)
	}
	fixed := mismatch
	fixed.Mismatched, fixed.At = 0, time.Now().UTC()
	publishReports(t, s.ctx, fixed)
	out, _ = s.must(t, 0, "status", plan)
	if got := rowOf(t, out, "GROUP ", billing); got[len(got)-1] != "passes" {
		t.Fatalf("billing after its report passed: %q:\n%s", got, out)
	}
	s.must(t, 0, "request", plan, "CUTOVER", "--slices", "6")

	out, _ = s.must(t, 0, "status", plan, "--report-max-age", "1ms", "--producers-window", "1ms")
	if got := strings.Join(rowOf(t, out, "GROUP ", stock), " "); !strings.Contains(got, "fails: the report is older than 1ms") {
		t.Errorf("stock with --report-max-age 1ms: %q:\n%s", got, out)
	}
	if got := rowOf(t, out, "TOPIC  ", topic); strings.Join(got[1:], " ") != "0 no 0" {
		t.Errorf("producers of %s in the last 1ms: %q; want none:\n%s", topic, got, out)
	}
}

// After OLD_RETIRED every slice is on the new channel, and the shadow gate
// is behind the plan: status says so, for the plan and for each group's
// report, instead of "slices 0 of 128 moved" and a failing gate (issue 21
// item 5).
func TestMigrationStatusAfterOldRetired(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	plan, stock := "move-"+ferrytest.Suffix(), ferrytest.Name(t, "stock")
	s.must(t, 0, "create", plan, "--old-brokers", strings.Join(ferrytest.Brokers(t), ","), "--old-topic-template", "t.{aggregate_type}",
		"--new-brokers", strings.Join(ferrytest.BrokersB(t), ","), "--new-topic-template", "t.{aggregate_type}", "--groups", stock)
	if _, err := s.db.Pool.Exec(s.ctx, `INSERT INTO ferry_migration_step (migration, epoch, phase, slices)
		VALUES ($1, 1, 'DUAL_WRITE', 0), ($1, 2, 'CUTOVER', 128), ($1, 3, 'DUAL_WRITE', 0), ($1, 4, 'CUTOVER', 128), ($1, 5, 'OLD_RETIRED', 0)`,
		plan); err != nil {
		t.Fatal(err)
	}
	// What a worker reports once the old channel is retired and its last
	// shadow copies left the window: copies of the new channel alone.
	publishReports(t, s.ctx, migration.Report{Plan: plan, Group: stock, At: time.Now().UTC(), Authoritative: 500, AllowedLateness: 30 * time.Second,
		Window: 2 * time.Minute, OldFenceEpoch: 4})
	out, _ := s.must(t, 0, "status", plan)
	if !strings.Contains(out, "slices  128 of 128 moved") {
		t.Errorf("status of a plan in OLD_RETIRED does not say every slice moved:\n%s", out)
	}
	if got := strings.Join(rowOf(t, out, "GROUP ", stock), " "); !strings.HasSuffix(got, "not needed: the old channel is retired") {
		t.Errorf("stock's report in OLD_RETIRED: %q; want the gate said to be behind the plan:\n%s", got, out)
	}
	out, _ = s.must(t, 0, "list")
	if got := strings.Join(rowOf(t, out, "NAME ", plan), " "); !strings.Contains(got, "OLD_RETIRED 128/128 5") {
		t.Errorf("list shows %q for a plan in OLD_RETIRED; want 128/128 slices:\n%s", got, out)
	}
}

// An old channel that cannot be reached leaves the plan shown, says why
// the rest is missing, and exits 0: status informs, request decides.
func TestMigrationStatusWithoutTheOldChannel(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	s.must(t, 0, "create", "move-1", "--old-brokers", "127.0.0.1:1", "--old-topic-template", "t.{aggregate_type}",
		"--new-brokers", "b:9092", "--new-topic-template", "t.{aggregate_type}", "--groups", "stock")
	out, _ := s.must(t, 0, "status", "move-1", "--old-channel-timeout", "5s")
	for _, line := range []string{"phase   OLD_ONLY", "old channel 127.0.0.1:1 (read within 5s", "old channel not reached: ",
		"the groups' reports and the old channel's producers are not shown"} {
		if !strings.Contains(out, line) {
			t.Errorf("status lacks %q:\n%s", line, out)
		}
	}
	if strings.Contains(out, "GROUP ") || strings.Contains(out, "TOPIC ") {
		t.Errorf("status shows tables it could not read:\n%s", out)
	}
}

// A plan's topic templates pass the check `relay run --topic-template`
// passes: create refuses, by flag, with the reason run gives, whatever
// relay run refuses, and records nothing.
func TestMigrationCreateRefusesTheTopicTemplatesRunRefuses(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	for _, c := range []struct{ template, reason string }{
		{"outbox.{aggregate_type", "outbox.{aggregate_type"},
		{"outbox.{foo}", "unknown placeholder {foo}"},
		{"outbox}.{aggregate_type}}", "outbox}.{aggregate_type}}"},
		{"outbox.event.{aggregate_type}.dlq", "dead-letter"},
	} {
		code, _, runErr := run(t, s.ctx, "run", "--database-url", "postgres://x@127.0.0.1:1/x", "--kafka-brokers", "127.0.0.1:1",
			"--http-addr", "off", "--topic-template", c.template)
		if code != 2 || !strings.Contains(runErr, c.reason) {
			t.Fatalf("relay run --topic-template %q: exit %d, %q; want 2 naming %q", c.template, code, runErr, c.reason)
		}
		_, reason, _ := strings.Cut(runErr, c.template)
		for _, side := range []string{"old", "new"} {
			args := []string{"create", "m1", "--old-brokers", "a:9092", "--old-topic-template", "outbox.event.{aggregate_type}",
				"--new-brokers", "b:9092", "--new-topic-template", "outbox.event.{aggregate_type}", "--groups", "g"}
			args = append(args, "--"+side+"-topic-template", c.template)
			code, stdout, stderr := s.relay(t, args...)
			if code != 2 || !strings.Contains(stderr, "--"+side+"-topic-template") || !strings.Contains(stderr, reason) {
				t.Errorf("relay migration create --%s-topic-template %q: exit %d\n%s%s\nwant exit 2 naming the flag and, as run does, %q",
					side, c.template, code, stdout, stderr, reason)
			}
		}
	}
	if out, _ := s.must(t, 0, "list"); len(tableRows(t, out, "NAME ")) != 0 {
		t.Fatalf("plans recorded with a bad template:\n%s", out)
	}
}

// create stores the name of a SASL password variable, never its value,
// and warns when that variable is not set where create runs: the relay
// and the workers that follow the plan read it, and an unset one is most
// often a typo. The plan is created all the same (they run elsewhere).
func TestMigrationCreateWarnsOfAnUnsetPasswordVariable(t *testing.T) {
	const secret = "Sasl-s3cret-3318"
	t.Setenv("FERRY_TEST_MIGRATION_SET_PASS", secret)
	s := newMigrationSetup(t)
	_, stderr := s.must(t, 0, createArgs("move-1", "FERRY_TEST_MIGRATION_NO_SUCH_PASS")...)
	if !strings.Contains(stderr, "--new-sasl-password-env") || !strings.Contains(stderr, "FERRY_TEST_MIGRATION_NO_SUCH_PASS is not set") {
		t.Errorf("create with an unset password variable: stderr %q, want a warning naming the flag and the variable", stderr)
	}
	out, stderr := s.must(t, 0, createArgs("move-2", "FERRY_TEST_MIGRATION_SET_PASS")...)
	if strings.Contains(stderr, "not set") || strings.Contains(out+stderr, secret) {
		t.Errorf("create with a set password variable: stdout %q, stderr %q; want no warning and no secret", out, stderr)
	}
}

// status reads a RabbitMQ old channel: it reaches the broker with the
// password from the variable the plan names, and shows the groups'
// reports from its report stream (none yet), saying where the lag of a
// RabbitMQ channel is shown instead.
func TestMigrationStatusReadsARabbitMQOldChannel(t *testing.T) {
	t.Parallel()
	s := newMigrationSetup(t)
	s.must(t, 0, "create", "from-rabbit", "--old-kind", "rabbitmq", "--old-url", os.Getenv(ferrytest.EnvRabbitMQURL),
		"--old-password-env", ferrytest.EnvRabbitMQPassword, "--old-topic-template", "outbox.event.{aggregate_type}",
		"--new-brokers", strings.Join(ferrytest.Brokers(t), ","), "--new-topic-template", "outbox.event.{aggregate_type}", "--groups", "stock")
	out, _ := s.must(t, 0, "status", "from-rabbit", "--old-channel-timeout", "20s")
	for _, want := range []string{"reports on ferry.migration.reports", "stock", "no report of stock gives its lag on RabbitMQ yet",
		"by the user RabbitMQ validated", "none reported yet"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "old channel not reached") || strings.Contains(out, os.Getenv(ferrytest.EnvRabbitMQPassword)) {
		t.Errorf("status did not reach the old channel, or shows its password:\n%s", out)
	}
}
