package deploytest_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// query is a PromQL expression and where it stands, for the error messages.
type query struct{ where, expr string }

// dashboardQueries returns the PromQL of every panel target of
// deploy/grafana/ferry.json and the metric of every label_values variable.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(readDeploy(t, "grafana/ferry.json"), &dash); err != nil {
		t.Fatalf("deploy/grafana/ferry.json: %v", err)
	}
	var qs []query
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("deploy/grafana/ferry.json: panel %q has a target without expr", p.Title)
			}
			qs = append(qs, query{"dashboard panel " + p.Title, tg.Expr})
		}
	}
	for _, v := range dash.Templating.List {
		q, _ := v.Query.(map[string]any)
		if s, _ := q["query"].(string); labelValuesMetric(s) != "" {
			qs = append(qs, query{"dashboard variable " + v.Name, labelValuesMetric(s)})
		}
	}
	return qs
}

// alertRules are the rules of deploy/prometheus/ferry-alerts.yml.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readAlertRules(t *testing.T) *alertRules {
	t.Helper()
	var r alertRules
	dec := yaml.NewDecoder(strings.NewReader(string(readDeploy(t, "prometheus/ferry-alerts.yml"))))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("deploy/prometheus/ferry-alerts.yml: %v", err)
	}
	return &r
}

// ruleQueries returns the expr of every alerting rule.
func ruleQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, g := range readAlertRules(t).Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{"alert " + r.Alert, r.Expr})
		}
	}
	return qs
}

func readDeploy(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ferrytest.RepoRoot(t), "deploy", path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every alert is well formed and has its runbook line in docs/observability.md,
// where its runbook_url points.
func TestAlertRulesHaveRunbooks(t *testing.T) {
	t.Parallel()
	rules := readAlertRules(t)
	runbook, err := os.ReadFile(filepath.Join(ferrytest.RepoRoot(t), "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("group %s: rule %q lacks alert, expr, a severity label or a summary", g.Name, r.Alert)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("alert %s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if !strings.HasSuffix(r.Annotations["runbook_url"], "/docs/observability.md#alerts") {
				t.Errorf("alert %s: runbook_url %q, want .../docs/observability.md#alerts", r.Alert, r.Annotations["runbook_url"])
			}
			if !strings.Contains(string(runbook), "| `"+r.Alert+"` |") {
				t.Errorf("alert %s has no runbook line (| `%s` | ...) in docs/observability.md", r.Alert, r.Alert)
			}
		}
	}
	if n < 6 {
		t.Fatalf("found %d alerting rules, want at least 6", n)
	}
}

// Every metric that the dashboard and the alerting rules use is exported
// by a running relay or worker: the relay publishes, quarantines an event
// too large for its topic, and the worker applies, retries, dead-letters,
// gets stuck on a dead-letter topic that does not exist, and parks a
// message whose dead letter is too large, so that every series they read
// exists.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	t.Parallel()
	queries := append(dashboardQueries(t), ruleQueries(t)...)
	used := map[string][]string{} // metric -> where
	for _, q := range queries {
		names := metricNames(q.expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric found in %q", q.where, q.expr)
		}
		for _, n := range names {
			used[n] = append(used[n], q.where)
		}
	}
	if len(used) < 20 {
		t.Fatalf("the dashboard and rules use only %d metrics: the parsing missed some", len(used))
	}

	ctx := ferrytest.Context(t, 3*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	suffix := ferrytest.Suffix()
	applied, stuck, refused := "dt"+suffix+"a", "dt"+suffix+"b", "dt"+suffix+"c"
	small := "1024"
	for _, agg := range []string{applied, stuck} {
		ferrytest.CreateTopic(t, "outbox.event."+agg, 1)
	}
	ferrytest.CreateTopic(t, "outbox.event."+applied+".dlq", 1)
	ferrytest.CreateTopicConfig(t, "outbox.event."+refused, 1, map[string]*string{"max.message.bytes": &small})

	relayAddr, workerAddr := freeAddr(t), freeAddr(t)
	var logs ferrytest.Buffer
	relayExited := serve(t, ctx, "relay", &logs, func(ctx context.Context) int {
		return relaycli.Main(ctx, []string{"run", "--database-url", db.URL, "--kafka-brokers", brokers, "--slot", "deploytest_" + suffix,
			"--http-addr", relayAddr, "--log-format", "json", "--prune-interval", "0"}, io.Discard, &logs)
	})
	waitReady(t, ctx, relayAddr, relayExited, &logs)

	register := func(w *inbox.Worker) error {
		for _, agg := range []string{applied, stuck} {
			w.Handle("deploytest", "outbox.event."+agg, func(_ context.Context, _ pgx.Tx, m *inbox.Message) error {
				switch {
				case m.EventType == "Fail":
					return inbox.Permanent(errors.New("refused by the test"))
				case m.EventType == "RetryOnce" && m.Attempt == 1:
					return errors.New("failed once by the test")
				}
				return nil
			})
		}
		return nil
	}
	workerExited := serve(t, ctx, "worker", &logs, func(ctx context.Context) int {
		return workercli.Main(ctx, []string{"run", "--database-url", db.URL, "--kafka-brokers", brokers, "--http-addr", workerAddr,
			"--log-format", "json", "--prune-interval", "0", "--retry-backoff", "10ms", "--retry-backoff-max", "200ms"},
			io.Discard, &logs, &workercli.App{Name: "deploytest-worker", Register: register})
	})
	waitReady(t, ctx, workerAddr, workerExited, &logs)

	// Random, so that compression cannot bring it under the limit.
	random := make([]byte, 4096)
	_, _ = rand.Read(random)
	big := []byte(hex.EncodeToString(random))
	if _, err := outbox.Write(ctx, db.Pool,
		outbox.Event{AggregateType: applied, AggregateID: "1", EventType: "Ok"},
		outbox.Event{AggregateType: applied, AggregateID: "2", EventType: "RetryOnce"},
		outbox.Event{AggregateType: applied, AggregateID: "3", EventType: "Fail"},
		outbox.Event{AggregateType: stuck, AggregateID: "4", EventType: "Fail", Payload: big},
		outbox.Event{AggregateType: refused, AggregateID: "5", EventType: "TooLarge", Payload: big},
	); err != nil {
		t.Fatal(err)
	}

	// The dead letter of the stuck topic waits for its dead-letter topic;
	// created too small for it, it is parked.
	exported := func() map[string]bool {
		names := map[string]bool{}
		for _, addr := range []string{relayAddr, workerAddr} {
			for _, n := range scrape(t, ctx, addr) {
				names[n] = true
			}
		}
		return names
	}
	for !exported()["ferry_worker_stuck_partitions"] {
		if ctx.Err() != nil {
			t.Fatalf("the worker never reported a stuck partition:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	ferrytest.CreateTopicConfig(t, "outbox.event."+stuck+".dlq", 1, map[string]*string{"max.message.bytes": &small})

	deadline := time.Now().Add(90 * time.Second)
	for {
		names := exported()
		var missing []string
		for n, where := range used {
			if !names[n] {
				missing = append(missing, fmt.Sprintf("%s (used by %s)", n, strings.Join(slices.Compact(where), ", ")))
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			slices.Sort(missing)
			t.Fatalf("metrics the dashboard or alerts use that neither the relay nor the worker exports:\n  %s\n\nlogs:\n%s",
				strings.Join(missing, "\n  "), logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// serve runs main until the test ends and checks that it exits 0 then. The
// channel it returns closes if main returns before.
func serve(t *testing.T, ctx context.Context, name string, logs *ferrytest.Buffer, main func(context.Context) int) <-chan struct{} {
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	code := 0
	go func() {
		defer close(exited)
		code = main(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if <-exited; code != 0 {
			t.Errorf("%s exited %d:\n%s", name, code, logs.String())
		}
	})
	return exited
}

// waitReady waits until addr's /readyz answers 200, failing if the process
// serving it exits first.
func waitReady(t *testing.T, ctx context.Context, addr string, exited <-chan struct{}, logs *ferrytest.Buffer) {
	t.Helper()
	for {
		if status, _ := get(ctx, "http://"+addr+"/readyz"); status == http.StatusOK {
			return
		}
		select {
		case <-exited:
			t.Fatalf("the process serving %s exited before it was ready:\n%s", addr, logs.String())
		case <-ctx.Done():
			t.Fatalf("%s/readyz never answered 200:\n%s", addr, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// scrape returns the names of the series addr's /metrics exports, as
// PromQL selects them (a histogram's _bucket, _sum and _count).
func scrape(t *testing.T, ctx context.Context, addr string) []string {
	t.Helper()
	status, body := get(ctx, "http://"+addr+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("%s/metrics: %d %s", addr, status, body)
	}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names = append(names, line[:i])
		}
	}
	return names
}

func get(ctx context.Context, url string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
