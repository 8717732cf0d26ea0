package demo

import (
	"bytes"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// The demo, as `make demo ARGS="--once --broker B"` runs it (the relay, two
// workers and the API as processes, a relay and a worker SIGKILLed
// mid-run), holds the same checks on Kafka and on RabbitMQ: every order has
// exactly one reservation and one stock decision, the stock adds up, the
// malformed events are dead letters, nothing is quarantined, and the
// records counted on the broker cover every event. Events an earlier run
// left unconsumed on the broker are not applied to this run's database. The subtests share the
// demo's database, so they run one after the other.
func TestDemoHoldsItsChecksOnEachBroker(t *testing.T) {
	admin := ferrytest.AdminURL(t)
	for _, b := range []struct{ broker, flag, value, name string }{
		{brokerKafka, "--kafka-brokers", strings.Join(ferrytest.Brokers(t), ","), "Kafka"},
		{brokerRabbitMQ, "--rabbitmq-url", os.Getenv(ferrytest.EnvRabbitMQURL), "RabbitMQ"},
	} {
		t.Run(b.broker, func(t *testing.T) {
			if b.broker == brokerRabbitMQ {
				ferrytest.RabbitMQURL(t) // fails without the stack's RabbitMQ and its password
			}
			ctx := ferrytest.Context(t, 5*time.Minute)
			// What an earlier run left on the broker is not this run's.
			if b.broker == brokerRabbitMQ {
				leaveStaleRabbitMQEvents(ctx, t, b.value, os.Getenv(ferrytest.EnvRabbitMQPassword))
			} else {
				leaveStaleKafkaEvents(ctx, t)
			}
			const orders, malformed = 200, 4
			args := []string{"--broker", b.broker, b.flag, b.value, "--admin-url", admin, "--once",
				"--orders", strconv.Itoa(orders), "--rate", "200", "--malformed", strconv.Itoa(malformed), "--timeout", "3m",
				"--api-addr", freeAddr(t), "--relay-http", freeAddr(t), "--worker-http", freeAddr(t), "--worker2-http", freeAddr(t)}
			var out bytes.Buffer
			err := runDemo(ctx, args, &out, &out)
			summary := out.String()
			if err != nil {
				t.Fatalf("demo on %s: %v\n%s", b.name, err, summary)
			}
			if pw := os.Getenv(ferrytest.EnvRabbitMQPassword); pw != "" && strings.Contains(summary, pw) {
				t.Fatal("the demo's output shows the RabbitMQ password")
			}
			for _, want := range []string{
				"== reserva demo summary (",
				", on " + b.name + ")",
				"exactly one reservation per order    yes (200 outcomes for 200 orders; 200 decided)",
				"exactly one stock decision per order yes (200 StockReserved/StockRejected events for 200 orders)",
				"stock consistent                     yes",
				"events written to the outbox         404",
				"dead-lettered messages               4",
				"quarantined events                   0",
				"deadlocks                            0",
				"relay SIGKILL at",
			} {
				if !strings.Contains(summary, want) {
					t.Errorf("the summary on %s lacks %q:\n%s", b.name, want, summary)
				}
			}
			if !regexp.MustCompile(`worker-[12] SIGKILL at`).MatchString(summary) {
				t.Errorf("the summary on %s names no worker killed:\n%s", b.name, summary)
			}
			m := regexp.MustCompile(`records relayed to ` + b.name + ` +(\d+) `).FindStringSubmatch(summary)
			if m == nil {
				t.Fatalf("the summary on %s does not count the records relayed:\n%s", b.name, summary)
			}
			if n, _ := strconv.Atoi(m[1]); n < 2*orders+malformed {
				t.Errorf("%d records relayed to %s for %d events: some never reached the broker\n%s", n, b.name, 2*orders+malformed, summary)
			}
			t.Logf("demo on %s:\n%s", b.name, summary[strings.Index(summary, "== reserva demo summary"):])
		})
	}
}
