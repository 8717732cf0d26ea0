package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

func TestReasonKindShowsARejectionOnceWhateverItsFigures(t *testing.T) {
	t.Parallel()
	a := "premature: shadow gate not passed: group g: its newest report is from 2026-01-02T03:04:05Z, older than 2m0s"
	b := "premature: shadow gate not passed: group g: its newest report is from 2026-01-02T03:04:09Z, older than 2m0s"
	c := "premature: shadow gate not passed: group g: no event checked yet (no event with both copies)"
	if reasonKind(a) != reasonKind(b) {
		t.Errorf("the same reason with other times: %q and %q", reasonKind(a), reasonKind(b))
	}
	if reasonKind(a) == reasonKind(c) {
		t.Errorf("two reasons taken for one: %q", reasonKind(a))
	}
}

// The demo decides what to do from what the real commands print: an
// acceptance, a rejection with its reason, the quarantine's count. Run
// them in-process on a database of their own, so that a change of their
// output breaks this test rather than the demo.
func TestTheDemoReadsTheCommandsAnswers(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	plan := "demo-" + ferrytest.Suffix()
	run := func(main func(ctx context.Context, args []string, stdout, stderr *bytes.Buffer) int, args ...string) (string, int) {
		var stdout, stderr bytes.Buffer
		code := main(ctx, args, &stdout, &stderr)
		return stdout.String() + stderr.String(), code
	}
	relay := func(ctx context.Context, args []string, stdout, stderr *bytes.Buffer) int {
		return relaycli.Main(ctx, append(args, "--database-url", db.URL), stdout, stderr)
	}
	worker := func(ctx context.Context, args []string, stdout, stderr *bytes.Buffer) int {
		return workercli.Main(ctx, append(args, "--database-url", db.URL), stdout, stderr,
			&workercli.App{Name: "reserva-worker", Register: reserva.Register})
	}

	if out, code := run(relay, "migration", "create", plan, "--old-brokers", brokers, "--old-topic-template", oldTemplate,
		"--new-brokers", "127.0.0.1:9", "--new-topic-template", "reserva.v2.{aggregate_type}", "--groups", "g1"); code != 0 {
		t.Fatalf("create: exit %d: %s", code, out)
	}
	for _, c := range []struct {
		args     []string
		accepted bool
		reason   string
	}{
		{[]string{"DUAL_WRITE"}, true, "accepted: the relay writes both channels"},
		{[]string{"CUTOVER", "--slices", "6"}, false, "premature: shadow gate not passed: group g1: "}, // no worker reports
		{[]string{"OLD_RETIRED"}, false, "forbidden: DUAL_WRITE -> OLD_RETIRED"},
	} {
		out, code := run(relay, append([]string{"migration", "request", plan}, c.args...)...)
		accepted, reason, ok := decision(out, code)
		if !ok || accepted != c.accepted || !strings.HasPrefix(reason, c.reason) {
			t.Errorf("request %v: decision(exit %d) = %v, %q, %v; want %v, %q...\n%s", c.args, code, accepted, reason, ok, c.accepted, c.reason, out)
		}
	}
	if _, _, ok := decision("relay migration: connect: refused\n", 1); ok {
		t.Error("a failure to decide read as a decision")
	}

	out, code := run(worker, "migration", "quarantine", "list")
	if n, ok := quarantinedCount(out); code != 0 || !ok || n != 0 {
		t.Errorf("quarantine list: exit %d, count %d, %v; want 0, 0, true\n%s", code, n, ok, out)
	}
}

// From RabbitMQ, the demo shows the producers section of `relay migration
// status`, which it finds by its heading: printed even before any worker
// reported one.
func TestTheDemoFindsTheProducersInTheStatus(t *testing.T) {
	t.Parallel()
	ferrytest.RabbitMQURL(t) // fails without the stack's RabbitMQ and its password
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	plan := "demo-" + ferrytest.Suffix()
	relay := func(args ...string) (string, int) {
		var stdout, stderr bytes.Buffer
		code := relaycli.Main(ctx, append(args, "--database-url", db.URL), &stdout, &stderr)
		return stdout.String() + stderr.String(), code
	}
	if out, code := relay("migration", "create", plan, "--old-kind", brokerRabbitMQ, "--old-url", os.Getenv(ferrytest.EnvRabbitMQURL),
		"--old-password-env", ferrytest.EnvRabbitMQPassword, "--old-topic-template", oldTemplate,
		"--new-brokers", "127.0.0.1:9", "--new-topic-template", "reserva.v2.{aggregate_type}", "--groups", "g1"); code != 0 {
		t.Fatalf("create: exit %d: %s", code, out)
	}
	out, code := relay("migration", "status", plan)
	if code != 0 || producersSection(out) == "" {
		t.Errorf("status: exit %d, no line beginning %q:\n%s", code, producersHeading, out)
	}
}

// A demo keeps asking a closed gate while the reason's figures move, gives
// up once the same reason stood still for the gate timeout, and after the
// longest wait even while they move.
func TestGatePatienceWaitsWhileTheFiguresMove(t *testing.T) {
	t0 := time.Unix(1_000, 0)
	g := gatePatience{stillFor: time.Minute, most: 10 * time.Minute, start: t0}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for i, d := range []time.Duration{0, 50 * time.Second, 100 * time.Second, 150 * time.Second} {
		if why := g.giveUp(fmt.Sprintf("2 groups lag: %d events behind", 100-i), at(d)); why != "" {
			t.Fatalf("gave up at %s while the figures moved: %s", d, why)
		}
	}
	if why := g.giveUp("2 groups lag: 97 events behind", at(150*time.Second+59*time.Second)); why != "" {
		t.Fatalf("gave up 59s into an unchanged reason: %s", why)
	}
	if why := g.giveUp("2 groups lag: 97 events behind", at(150*time.Second+time.Minute)); why != "unchanged for 1m0s" {
		t.Fatalf("after a minute unchanged: %q, want unchanged for 1m0s", why)
	}
	g = gatePatience{stillFor: time.Minute, most: 10 * time.Minute, start: t0}
	for d := time.Duration(0); d < 10*time.Minute; d += 30 * time.Second {
		if why := g.giveUp(d.String(), at(d)); why != "" {
			t.Fatalf("gave up at %s: %s", d, why)
		}
	}
	if why := g.giveUp("moving still", at(10*time.Minute)); why != "still rejected after 10m0s" {
		t.Fatalf("at the longest wait: %q", why)
	}
}
