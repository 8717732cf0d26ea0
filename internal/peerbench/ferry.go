package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// ferryPeer is Ferry's relay: `relay run`, a real process, with its
// default settings, as internal/ferrybench runs it.
type ferryPeer struct {
	b    *bench
	db   outboxDB
	addr string
}

func (f *ferryPeer) Name() string     { return "Ferry relay" }
func (f *ferryPeer) Topic() string    { return f.b.topic("ferry") }
func (f *ferryPeer) IDHeader() string { return outbox.HeaderID }
func (f *ferryPeer) Close()           { f.db.close() }

func (f *ferryPeer) Prepare(ctx context.Context) error {
	return f.db.prepare(ctx, "peers_ferry", "peers_ferry_"+f.b.suffix)
}

func (f *ferryPeer) WriteBacklog(ctx context.Context, n, perTx int) error {
	return f.db.writeBacklog(ctx, n, perTx, f.b.payload)
}

func (f *ferryPeer) topicTemplate() string {
	return strings.TrimSuffix(f.Topic(), ".load") + ".{aggregate_type}"
}

func (f *ferryPeer) Start(ctx context.Context) (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	f.addr = addr
	args := []string{"run", "--slot", f.db.slot, "--topic-template", f.topicTemplate(), "--http-addr", addr, "--log-format", "json"}
	env := []string{"FERRY_DATABASE_URL=" + f.db.url}
	if r := f.b.rabbit; r != nil {
		args = append(args, "--rabbitmq-url", r.conn.URL)
		env = append(env, r.env()...)
	} else {
		env = append(env, "FERRY_KAFKA_BROKERS="+strings.Join(f.b.brokers, ","))
	}
	return startProcess(filepath.Join(f.b.dir, "ferry-relay.log"), env, f.b.relayBin, append(args, f.b.relayArgs...)...)
}

// Ready is the relay's readiness probe: it streams and Kafka takes the topic.
func (f *ferryPeer) Ready(ctx context.Context, _ *process) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.addr+"/readyz", nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, nil // not listening yet
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, nil
}

func (f *ferryPeer) Confirmed(ctx context.Context) (string, bool, error) { return f.db.confirmed(ctx) }

func (f *ferryPeer) Offer(ctx context.Context, rate int, dur time.Duration, committed func(string, time.Time)) error {
	return f.db.offer(ctx, rate, dur, f.b.payload, committed)
}

func (f *ferryPeer) Settings() string {
	if f.b.rabbit != nil {
		return fmt.Sprintf("relay run --slot SLOT --topic-template peers.ROUND.ferry.{aggregate_type} --http-addr ADDR --log-format json --rabbitmq-url URL (password in FERRY_RABBITMQ_PASSWORD)\n"+
			"every other setting at its default: --rabbitmq-shards %d, --rabbitmq-channels %d (confirm mode, mandatory, persistent, confirms streamed), --max-in-flight %d\n",
			relay.RabbitMQShardsDefault, relay.RabbitMQChannelsDefault, relay.MaxInFlightRecordsDefault)
	}
	return fmt.Sprintf("relay run --slot %s --topic-template %s --http-addr ADDR --log-format json\n"+
		"every other setting at its default: --max-in-flight %d, --status-interval %s, --read-window %s, --kafka-compression %s, GOMAXPROCS 1; producer: acks=all, no linger\n",
		f.db.slot, f.topicTemplate(), relay.MaxInFlightRecordsDefault, relay.StatusIntervalDefault, relay.ReadWindowDefault, cli.CompressionDefault)
}

func (f *ferryPeer) Marks() string {
	return fmt.Sprintf("standby status updates whose flush LSN is the end of the newest transaction Kafka acknowledged whole "+
		"(sent when that position moves, at most every 10 ms, and at least every --status-interval, %s)", relay.StatusIntervalDefault)
}
