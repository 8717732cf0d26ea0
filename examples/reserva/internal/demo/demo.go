package demo

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/otlprecv"
	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// demoDatabase is recreated at every run, so each summary counts one run.
const demoDatabase = "reserva_demo"

type options struct {
	adminURL, brokers, binDir        string
	broker, rabbitURL, rabbitPass    string
	orders, rate, malformed, clients int
	once, chaos                      bool
	apiAddr, relayAddr               string
	workerAddrs                      [2]string
	timeout                          time.Duration
}

// rateDefault is the pace of orders (a second) that a 2-core machine keeps
// up with while it also runs the relay, two workers, PostgreSQL and Kafka,
// so that the latency measures Ferry rather than a queue of orders.
const rateDefault = 100

// rateMax keeps the ticker's interval at a microsecond or more.
const rateMax = 1_000_000

// skus are the demo's products: plum and fig are scarce, so some orders are
// rejected for stock.
var skus = map[string]int{
	"apple": 100_000, "pear": 100_000, "cherry": 100_000, "grape": 100_000, "lemon": 100_000,
	"mango": 100_000, "melon": 100_000, "peach": 100_000, "kiwi": 100_000, "lime": 100_000,
	"plum": 250, "fig": 250,
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reserva demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.adminURL, "admin-url", cmp.Or(os.Getenv("FERRY_TEST_DATABASE_URL"), os.Getenv("FERRY_DATABASE_URL")), "PostgreSQL URL of a role that may create the demo's database "+demoDatabase+" (env FERRY_TEST_DATABASE_URL)")
	fs.StringVar(&o.brokers, "kafka-brokers", cmp.Or(os.Getenv("FERRY_TEST_KAFKA_BROKERS"), os.Getenv("FERRY_KAFKA_BROKERS")), "Kafka seed brokers (env FERRY_TEST_KAFKA_BROKERS)")
	fs.StringVar(&o.broker, "broker", cmp.Or(os.Getenv("FERRY_DEMO_BROKER"), brokerKafka), "the channel between the relay and the workers: kafka or rabbitmq (env FERRY_DEMO_BROKER)")
	fs.StringVar(&o.rabbitURL, "rabbitmq-url", cmp.Or(os.Getenv("FERRY_TEST_RABBITMQ_URL"), os.Getenv("FERRY_RABBITMQ_URL")), "with --broker rabbitmq: amqp://user@host:port/vhost, no password in it; the password comes from FERRY_TEST_RABBITMQ_PASSWORD or FERRY_RABBITMQ_PASSWORD only (env FERRY_TEST_RABBITMQ_URL)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory holding the relay, reserva-worker and reserva binaries; empty builds them")
	fs.IntVar(&o.orders, "orders", 3000, "orders placed through the HTTP API")
	fs.IntVar(&o.rate, "rate", rateDefault, "orders placed a second, at a steady pace")
	fs.IntVar(&o.malformed, "malformed", 5, "malformed OrderPlaced events written straight to the outbox, as a broken producer would")
	fs.IntVar(&o.clients, "clients", 8, "most orders in flight at once; when all are waiting for the API the pace falls behind --rate")
	fs.BoolVar(&o.once, "once", false, "exit when every order is decided, instead of running until Ctrl-C")
	fs.BoolVar(&o.chaos, "chaos", true, "SIGKILL the relay and a worker mid-run (and restart them) to show that nothing is lost or applied twice")
	fs.StringVar(&o.apiAddr, "api-addr", "127.0.0.1:8080", "order API address")
	fs.StringVar(&o.relayAddr, "relay-http", "127.0.0.1:9187", "relay metrics address")
	fs.StringVar(&o.workerAddrs[0], "worker-http", "127.0.0.1:9188", "first worker's metrics address")
	fs.StringVar(&o.workerAddrs[1], "worker2-http", "127.0.0.1:9189", "second worker's metrics address")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up when the orders are not all decided by then")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case o.adminURL == "":
		return errors.New("--admin-url (FERRY_TEST_DATABASE_URL) is required: run it through `make demo`, or after `eval \"$(scripts/stack up)\"`")
	case o.broker != brokerKafka && o.broker != brokerRabbitMQ:
		return fmt.Errorf("--broker must be %s or %s, not %q", brokerKafka, brokerRabbitMQ, o.broker)
	case o.broker == brokerKafka && o.brokers == "":
		return errors.New("--kafka-brokers (FERRY_TEST_KAFKA_BROKERS) is required")
	case o.broker == brokerRabbitMQ && o.rabbitURL == "":
		return errors.New("--rabbitmq-url (FERRY_TEST_RABBITMQ_URL) is required with --broker rabbitmq: run it through `make demo`, or after `eval \"$(scripts/stack up)\"`")
	case o.orders < 1:
		return fmt.Errorf("--orders must be positive, not %d", o.orders)
	case o.rate < 1 || o.rate > rateMax:
		return fmt.Errorf("--rate must be between 1 and %d orders a second, not %d", rateMax, o.rate)
	case o.clients < 1:
		return fmt.Errorf("--clients must be positive, not %d", o.clients)
	case o.malformed < 0:
		return fmt.Errorf("--malformed must be 0 or more, not %d", o.malformed)
	case o.timeout <= 0:
		return fmt.Errorf("--timeout must be positive, not %s", o.timeout)
	}
	o.rabbitPass = cmp.Or(os.Getenv("FERRY_TEST_RABBITMQ_PASSWORD"), os.Getenv("FERRY_RABBITMQ_PASSWORD"))
	d := &demo{o: o, out: stdout, start: time.Now()}
	if o.broker == brokerRabbitMQ {
		d.ch = &rabbitChannel{cfg: inbox.RabbitMQConfig{URL: o.rabbitURL, Password: o.rabbitPass, Shards: rabbitmq.ShardsDefault}}
	} else {
		d.ch = &kafkaChannel{brokers: o.brokers}
	}
	defer d.stopAll()
	return d.run(ctx)
}

type demo struct {
	o       options
	out     io.Writer
	start   time.Time
	dir     string
	url     string
	pool    *pgxpool.Pool
	ch      channel
	relay   *procs.Proc
	workers [2]*procs.Proc
	api     *procs.Proc
	faults  []string
	// firstFault is when the first fault was injected; zero without --chaos.
	firstFault time.Time

	placed, failed atomic.Int64
	pace           pace
	dups           dupCounter
	// traces receives the spans of the API and the workers, exported with
	// OTLP over HTTP (the OTEL_* variables they are started with), for the
	// summary's trace of one order.
	traces otlprecv.Receiver
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format+"\n", args...) }

func (d *demo) run(ctx context.Context) error {
	var err error
	if d.dir, err = os.MkdirTemp("", "reserva-demo-"); err != nil {
		return err
	}
	d.say("== reserva demo: logs in %s", d.dir)
	if err := d.prepare(ctx); err != nil {
		return err
	}
	if err := d.startProcesses(ctx); err != nil {
		return err
	}
	d.say("== placing %d orders through http://%s/orders at %d a second (at most %d in flight), plus %d malformed events",
		d.o.orders, d.o.apiAddr, d.o.rate, d.o.clients, d.o.malformed)
	placing := make(chan error, 1)
	go func() { placing <- d.placeOrders(ctx) }()
	if err := d.follow(ctx, placing); err != nil {
		return err
	}
	ok, err := d.summary(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("an order does not have exactly one reservation outcome, one stock decision, or the stock does not add up")
	}
	if d.o.once {
		return nil
	}
	d.say("\nEverything keeps running. Try:\n  curl -s http://%s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: try-1' -d '{\"customer\":\"you\",\"items\":[{\"sku\":\"apple\",\"qty\":1}]}'\n  curl -s http://%s/orders/<id>\nCtrl-C stops the relay, the workers and the API.", d.o.apiAddr, d.o.apiAddr)
	<-ctx.Done()
	d.say("\n== stopping")
	return nil
}

// prepare recreates the demo database, migrates it, seeds the stock and
// makes sure the topics exist.
func (d *demo) prepare(ctx context.Context) error {
	if err := ferrytest.DropDatabase(d.o.adminURL, demoDatabase); err != nil {
		return err
	}
	url, err := ferrytest.CreateDatabase(ctx, d.o.adminURL, demoDatabase)
	if err != nil {
		return err
	}
	d.url = url
	if d.pool, err = pgxpool.New(ctx, url); err != nil {
		return err
	}
	if err := Migrate(ctx, d.pool, nil); err != nil {
		return err
	}
	if err := reserva.SeedStock(ctx, d.pool, skus); err != nil {
		return err
	}
	stale, err := d.ch.prepare(ctx)
	if err != nil {
		return err
	}
	d.say("== database %s migrated (Ferry + reserva), stock seeded, slot %q ready; events go through %s", demoDatabase, "ferry", d.ch.name())
	if stale > 0 {
		d.say("   %d messages an earlier run left unconsumed on %s skipped: their orders are not in this database", stale, d.ch.name())
	}
	return nil
}

func (d *demo) startProcesses(ctx context.Context) error {
	bins := map[string]string{}
	if d.o.binDir == "" {
		d.say("== building relay, reserva-worker and reserva")
		paths, err := procs.Build(ctx, d.dir, "github.com/ferryhq/ferry/cmd/relay", "github.com/ferryhq/ferry/examples/reserva/cmd/reserva-worker", "github.com/ferryhq/ferry/examples/reserva/cmd/reserva")
		if err != nil {
			return err
		}
		bins["relay"], bins["reserva-worker"], bins["reserva"] = paths[0], paths[1], paths[2]
	} else {
		for _, b := range []string{"relay", "reserva-worker", "reserva"} {
			bins[b] = filepath.Join(d.o.binDir, b)
		}
	}
	traces, err := d.serveTraces()
	if err != nil {
		return err
	}
	env := append([]string{"FERRY_DATABASE_URL=" + d.url, "FERRY_LOG_FORMAT=json",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + traces, "OTEL_BSP_SCHEDULE_DELAY=200"}, d.ch.env()...)
	start := func(name, bin string, args ...string) (*procs.Proc, error) {
		return procs.Start(procs.Spec{Name: name, Path: bin, Args: args, Env: env, LogFile: filepath.Join(d.dir, name+".log")})
	}
	if d.relay, err = start("relay", bins["relay"], "run", "--http-addr", d.o.relayAddr); err != nil {
		return err
	}
	for i := range d.workers {
		args := append([]string{"run", "--http-addr", d.o.workerAddrs[i], "--retry-backoff", "50ms", "--max-attempts", "5"}, d.ch.workerArgs()...)
		if d.workers[i], err = start(fmt.Sprintf("worker-%d", i+1), bins["reserva-worker"], args...); err != nil {
			return err
		}
	}
	if d.api, err = start("api", bins["reserva"], "api", "--addr", d.o.apiAddr); err != nil {
		return err
	}
	for _, u := range []string{"http://" + d.o.relayAddr + "/readyz", "http://" + d.o.workerAddrs[0] + "/readyz", "http://" + d.o.workerAddrs[1] + "/readyz", "http://" + d.o.apiAddr + "/healthz"} {
		if err := waitHTTP(ctx, u, time.Minute); err != nil {
			return fmt.Errorf("%w (logs in %s)", err, d.dir)
		}
	}
	d.say("== relay, 2 workers and the order API are up")
	return nil
}

func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s", url, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// placeOrders writes the malformed events, then sends the orders over HTTP
// at --rate a second. One ticker paces them and up to --clients requests
// are in flight; when every client is still waiting for the API, the next
// order waits for one and the ticker drops the ticks it misses, so the pace
// falls behind (d.pace says by how much) instead of catching up in a burst.
func (d *demo) placeOrders(ctx context.Context) error {
	// A broken producer writes OrderPlaced events the workers cannot use.
	for i := range d.o.malformed {
		id := uuid.New()
		payload := []byte(`{"order_id": "` + id.String() + `", "items": [`) // truncated JSON
		if i%2 == 1 {
			payload = fmt.Appendf(nil, `{"order_id":"%s","customer":"x","items":[{"sku":"apple","qty":-1}]}`, id)
		}
		if _, err := outbox.Write(ctx, d.pool, outbox.Event{AggregateType: reserva.AggregateOrder, AggregateID: id.String(),
			EventType: reserva.EventOrderPlaced, Payload: payload}); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	orders := make(chan []byte) // unbuffered: an order is handed to an idle client
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for range d.o.clients {
		wg.Go(func() {
			for body := range orders {
				resp, err := client.Post("http://"+d.o.apiAddr+"/orders", "application/json", bytes.NewReader(body))
				if err != nil {
					d.failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					cancel(fmt.Errorf("POST /orders answered %d", resp.StatusCode))
					return
				}
				d.placed.Add(1)
			}
		})
	}

	names := make([]string, 0, len(skus))
	for s := range skus {
		names = append(names, s)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewPCG(1, 42))
	interval := time.Second / time.Duration(d.o.rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	d.pace.begin(time.Now(), interval)
	for i := range d.o.orders {
		req := reserva.PlaceOrderRequest{Customer: fmt.Sprintf("customer-%d", rng.IntN(500))}
		for _, j := range rng.Perm(len(names))[:1+rng.IntN(3)] {
			req.Items = append(req.Items, reserva.Item{SKU: names[j], Qty: 1 + rng.IntN(3)})
		}
		body, _ := json.Marshal(req)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		select {
		case <-ctx.Done():
		case orders <- body:
			d.pace.send(i, time.Now())
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(orders)
	wg.Wait()
	return context.Cause(ctx)
}

// follow prints progress once a second, injects the chaos, and returns once
// every placed order is decided and the malformed events are dead letters.
func (d *demo) follow(ctx context.Context, placing <-chan error) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.Now().Add(d.o.timeout)
	placingDone := false
	relayKilled, workerKilled := !d.o.chaos, !d.o.chaos
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-placing:
			if err != nil {
				return err
			}
			placingDone = true
			placing = nil
		case <-tick.C:
		}
		d.dups.scrape(d.o.workerAddrs[:])
		placed := d.placed.Load()
		if !relayKilled && placed >= int64(d.o.orders)*4/10 {
			relayKilled = true
			d.relay.Kill()
			d.fault("relay SIGKILL", placed)
			d.say("   chaos: relay killed with SIGKILL after %d orders; restarting it", placed)
			if err := d.relay.Restart(); err != nil {
				return err
			}
		}
		if !workerKilled && placed >= int64(d.o.orders)*6/10 {
			workerKilled = true
			i, why := d.victim()
			d.workers[i].Kill()
			d.fault(fmt.Sprintf("worker-%d SIGKILL", i+1), placed)
			d.say("   chaos: worker-%d%s killed with SIGKILL after %d orders; restarting it", i+1, why, placed)
			if err := d.workers[i].Restart(); err != nil {
				return err
			}
		}
		st, err := d.status(ctx)
		if err != nil {
			continue // PostgreSQL busy; try again next second
		}
		late := ""
		if behind := d.pace.behind(); !placingDone && behind >= behindShown {
			late = fmt.Sprintf(" (%.1fs behind --rate: every client is waiting for the API)", behind.Seconds())
		}
		d.say("   %5.1fs placed %d/%d%s · backlog %d · reserved %d · rejected %d · dead-lettered messages %d",
			time.Since(d.start).Seconds(), placed, d.o.orders, late, st.backlog, st.reserved, st.rejected, st.deadLettered)
		if placingDone && st.backlog == 0 && st.deadLettered >= d.o.malformed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("orders not all decided after %s (logs in %s)", d.o.timeout, d.dir)
		}
	}
}

// victim is the worker the chaos kills. On Kafka the two share the
// partitions, and it is worker-2. On RabbitMQ every shard queue has a single
// active consumer (on 3.x the first worker registered is active on all of
// them and the other waits), so it is the worker that applied more: killing
// the idle one would test nothing.
func (d *demo) victim() (int, string) {
	if d.o.broker != brokerRabbitMQ {
		return 1, ""
	}
	var applied [2]float64
	for i, a := range d.o.workerAddrs {
		applied[i], _ = scrapeCounter("http://"+a+"/metrics", "ferry_worker_messages_processed_total")
	}
	i := 0
	if applied[1] > applied[0] {
		i = 1
	}
	return i, fmt.Sprintf(" (the active consumer: %.0f messages applied against %.0f)", applied[i], applied[1-i])
}

// behindShown is how far behind --rate the placing must fall before the
// progress lines and the summary say so; a few late ticks are noise.
const behindShown = 500 * time.Millisecond

// fault records a fault injected now, for the summary.
func (d *demo) fault(what string, placed int64) {
	now := time.Now()
	if d.firstFault.IsZero() {
		d.firstFault = now
	}
	d.faults = append(d.faults, fmt.Sprintf("%s at %.1fs after %d orders", what, now.Sub(d.start).Seconds(), placed))
}

// status is the demo's state at one moment. The backlog is the orders
// placed but not decided yet.
type status struct {
	reserved, rejected, backlog, deadLettered int
}

func (d *demo) status(ctx context.Context) (status, error) {
	var st status
	err := d.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'reserved'), count(*) FILTER (WHERE status = 'rejected'),
		count(*) FILTER (WHERE status = 'placed') FROM orders`).Scan(&st.reserved, &st.rejected, &st.backlog)
	if err != nil {
		return st, err
	}
	dls, err := d.ch.deadLetters(ctx, d.start, false)
	st.deadLettered = countDeadLetters(dls).messages
	return st, err
}

// logLines counts needle in the logs of dir whose names
// start with prefix; a log that cannot be read counts nothing.
func logLines(dir, prefix, needle string) int {
	paths, _ := filepath.Glob(filepath.Join(dir, prefix+"*.log"))
	n := 0
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		n += bytes.Count(b, []byte(needle))
	}
	return n
}

// summary prints the figures of the run and reports whether every order
// has exactly one reservation outcome.
func (d *demo) summary(ctx context.Context) (bool, error) {
	var orders, outcomes, decided, badOutcomes, quarantined, outboxRows int
	err := d.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM orders),
		       (SELECT count(*) FROM reservations r JOIN orders o ON o.id = r.order_id),
		       (SELECT count(*) FROM orders WHERE status <> 'placed'),
		       (SELECT count(*) FROM orders o LEFT JOIN reservations r ON r.order_id = o.id WHERE r.outcome IS DISTINCT FROM o.status),
		       (SELECT count(*) FROM outbox_quarantine),
		       (SELECT count(*) FROM outbox)`).
		Scan(&orders, &outcomes, &decided, &badOutcomes, &quarantined, &outboxRows)
	if err != nil {
		return false, err
	}
	all, err := d.latency(ctx, time.Time{})
	if err != nil {
		return false, err
	}
	calm, err := d.latency(ctx, d.firstFault)
	if err != nil {
		return false, err
	}
	// The backlog at any moment is the orders placed minus those decided by
	// then: replay both timestamps in order and keep the peak.
	var peak int
	var peakAt time.Time
	err = d.pool.QueryRow(ctx, `
		SELECT backlog, at FROM (
			SELECT at, sum(delta) OVER (ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS backlog
			FROM (SELECT created_at AS at, 1 AS delta FROM orders
			      UNION ALL SELECT decided_at, -1 FROM orders WHERE decided_at IS NOT NULL) e) b
		ORDER BY backlog DESC, at LIMIT 1`).Scan(&peak, &peakAt)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, err
	}
	st, err := d.status(ctx)
	if err != nil {
		return false, err
	}
	relayed, err := d.ch.records(ctx)
	if err != nil {
		return false, err
	}
	dls, err := d.ch.deadLetters(ctx, d.start, true)
	if err != nil {
		return false, err
	}
	d.dups.scrape(d.o.workerAddrs[:])
	decisions, stockOff, err := d.stockChecks(ctx)
	if err != nil {
		return false, err
	}
	once := outcomes == orders && badOutcomes == 0 && int64(orders) == d.placed.Load()
	ok := once && decisions == orders && len(stockOff) == 0

	w := bufio.NewWriter(d.out)
	defer w.Flush()
	row := func(label, value string) { fmt.Fprintf(w, "  %-36s %s\n", label, value) }
	fmt.Fprintf(w, "\n== reserva demo summary (%s, on %s)\n", time.Since(d.start).Round(time.Second), d.ch.name())
	placing := fmt.Sprintf("%d, at %.0f a second (--rate %d)", orders, d.pace.rate(), d.o.rate)
	if behind := d.pace.behind(); behind >= behindShown {
		placing += fmt.Sprintf(": %.1fs behind, every client waiting for the API", behind.Seconds())
	}
	row("orders placed (HTTP 201)", placing)
	row("  reserved", strconv.Itoa(st.reserved))
	row("  rejected (not enough stock)", strconv.Itoa(st.rejected))
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "NO"
	}
	row("exactly one reservation per order", fmt.Sprintf("%s (%d outcomes for %d orders; %d decided)", yes(once), outcomes, orders, decided))
	row("exactly one stock decision per order", fmt.Sprintf("%s (%d StockReserved/StockRejected events for %d orders)", yes(decisions == orders), decisions, orders))
	stock := "every SKU: seeded minus what its reserved orders hold"
	if len(stockOff) > 0 {
		stock = strings.Join(stockOff, "; ")
	}
	row("stock consistent", fmt.Sprintf("%s (%s)", yes(len(stockOff) == 0), stock))
	row("events written to the outbox", strconv.Itoa(outboxRows))
	row("records relayed to "+d.ch.name(), fmt.Sprintf("%d (%d more than events: republished after the relay was killed)", relayed, relayed-int64(outboxRows)))
	row("effects applied", fmt.Sprintf("%d reservations + %d order status changes", outcomes, decided))
	row("duplicates blocked by the inbox", fmt.Sprintf("at least %d (ferry_worker_duplicates_skipped_total)", d.dups.total()))
	dl := countDeadLetters(dls)
	row("dead-lettered messages", strconv.Itoa(dl.messages))
	for _, r := range dl.reasons() {
		row("  "+string(r), fmt.Sprintf("%d, e.g. %q", dl.byReason[r], trim(dl.example[r], 80)))
	}
	records := strconv.Itoa(dl.records)
	if extra := dl.extra(); extra != "" {
		records += " (" + extra + ")"
	}
	row("dead-letter records", records)
	row("quarantined events", strconv.Itoa(quarantined))
	if quarantined > 0 {
		rows, err := d.pool.Query(ctx, `SELECT reason, count(*) FROM outbox_quarantine GROUP BY reason ORDER BY reason`)
		if err == nil {
			for rows.Next() {
				var r string
				var n int
				if rows.Scan(&r, &n) == nil {
					row("  "+r, strconv.Itoa(n))
				}
			}
			rows.Close()
		}
	}
	row("order placed -> decided latency", all.String())
	if !d.firstFault.IsZero() {
		row("  decided before the first fault", fmt.Sprintf("%s (%d orders)", calm, calm.orders))
	}
	row("backlog (placed, not yet decided)", fmt.Sprintf("max %d orders, at %.1fs; %d at the end", peak, peakAt.Sub(d.start).Seconds(), st.backlog))
	row("deadlocks", fmt.Sprintf("%d (SQLSTATE 40P01 in the workers' logs)", logLines(d.dir, "worker-", "SQLSTATE 40P01")))
	if len(d.faults) > 0 {
		row("faults injected", strings.Join(d.faults, "; "))
	}
	if tree := d.orderTrace(ctx); tree != "" {
		fmt.Fprintf(w, "  %s\n%s", "the median order's trace (OTLP from the API and the workers):", tree)
	}
	row("metrics", fmt.Sprintf("relay http://%s/metrics · workers http://%s/metrics http://%s/metrics", d.o.relayAddr, d.o.workerAddrs[0], d.o.workerAddrs[1]))
	row("logs", d.dir)
	return ok, nil
}

// stockChecks counts the stock decisions the workers chained (one an order,
// or a duplicate delivery chained one twice) and names the SKUs whose stock
// is not what was seeded minus what the reserved orders hold.
func (d *demo) stockChecks(ctx context.Context) (decisions int, off []string, err error) {
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregate_type = $1`, reserva.AggregateStock).Scan(&decisions); err != nil {
		return 0, nil, err
	}
	rows, err := d.pool.Query(ctx, `
		SELECT s.sku, s.available, coalesce(sum(i.qty) FILTER (WHERE r.outcome = 'reserved'), 0)
		FROM stock s LEFT JOIN order_items i ON i.sku = s.sku LEFT JOIN reservations r ON r.order_id = i.order_id
		GROUP BY s.sku, s.available ORDER BY s.sku`)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var sku string
		var available, reserved int
		if err := rows.Scan(&sku, &available, &reserved); err != nil {
			return 0, nil, err
		}
		if available != skus[sku]-reserved {
			off = append(off, fmt.Sprintf("%s: %d available, want %d - %d reserved", sku, available, skus[sku], reserved))
		}
	}
	return decisions, off, rows.Err()
}

// latency is how long orders took from placed to decided, in seconds.
type latency struct {
	orders          int
	p50, p99, worst float64
}

func (l latency) String() string {
	return fmt.Sprintf("p50 %.0f ms · p99 %.0f ms · max %.0f ms", l.p50*1000, l.p99*1000, l.worst*1000)
}

// latency measures the orders decided before the given time, or all of
// them when it is zero.
func (d *demo) latency(ctx context.Context, before time.Time) (latency, error) {
	var until *time.Time
	if !before.IsZero() {
		until = &before
	}
	var l latency
	err := d.pool.QueryRow(ctx, `
		SELECT count(*),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY s), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY s), 0),
		       coalesce(max(s), 0)
		FROM (SELECT extract(epoch FROM decided_at - created_at)::float8 AS s FROM orders
		      WHERE decided_at IS NOT NULL AND ($1::timestamptz IS NULL OR decided_at < $1)) o`, until).
		Scan(&l.orders, &l.p50, &l.p99, &l.worst)
	return l, err
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// stopAll stops the API, the workers and the relay politely.
func (d *demo) stopAll() {
	for _, p := range []*procs.Proc{d.api, d.workers[0], d.workers[1], d.relay} {
		if p != nil {
			_ = p.Stop(30 * time.Second)
		}
	}
	if d.pool != nil {
		// A slot nobody reads pins WAL; the next demo makes a new one.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _ = d.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		cancel()
		d.pool.Close()
	}
}

// dupCounter adds up the workers' duplicates_skipped counters across
// restarts, which reset them.
type dupCounter struct {
	mu   sync.Mutex
	last map[string]float64
	base float64
}

func (c *dupCounter) scrape(addrs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]float64{}
	}
	for _, a := range addrs {
		v, err := scrapeCounter("http://"+a+"/metrics", "ferry_worker_duplicates_skipped_total")
		if err != nil {
			continue
		}
		if v < c.last[a] {
			c.base += c.last[a] // the worker restarted
		}
		c.last[a] = v
	}
}

func (c *dupCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.base
	for _, v := range c.last {
		t += v
	}
	return int(t)
}

// scrapeCounter sums every series of a counter on a /metrics page.
func scrapeCounter(url, name string) (float64, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}
