package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
)

// debeziumPeer is Debezium's PostgreSQL connector with its outbox
// EventRouter SMT in Kafka Connect standalone: one JVM, every jar on its
// classpath (bench/peers/debezium/pom.xml), started by the driver itself.
type debeziumPeer struct {
	b  *bench
	db outboxDB
}

// Debezium's throughput settings, as its documentation describes them:
// larger batches and queue than the defaults (2048, 8192; the queue must be
// larger than the batch), a short poll interval (default 500 ms: how long a
// poll waits for a batch to fill, so the latency floor at a low rate), and
// producer batching through Connect's producer.* worker settings.
// offset.flush.interval.ms is how often Connect records the source offsets,
// and with them Debezium confirms its LSN to the slot: 1 s, as Ferry's
// status interval (Connect's default is 60 s).
var (
	debeziumConnector = [][2]string{
		{"max.batch.size", "8192"},
		{"max.queue.size", "32768"},
		{"poll.interval.ms", "10"},
	}
	debeziumWorker = [][2]string{
		{"offset.flush.interval.ms", "1000"},
		{"producer.linger.ms", "5"},
		{"producer.batch.size", "262144"},
		{"producer.compression.type", cli.CompressionDefault}, // Ferry's (and Connect's own): the broker's CPU is compared
	}
)

func (d *debeziumPeer) Name() string     { return "Debezium" }
func (d *debeziumPeer) Topic() string    { return d.b.topic("debezium") }
func (d *debeziumPeer) IDHeader() string { return "id" } // the EventRouter's header for table.field.event.id
func (d *debeziumPeer) Close()           { d.db.close() }

func (d *debeziumPeer) Prepare(ctx context.Context) error {
	return d.db.prepare(ctx, "peers_debezium", "peers_debezium_"+d.b.suffix)
}

func (d *debeziumPeer) WriteBacklog(ctx context.Context, n, perTx int) error {
	return d.db.writeBacklog(ctx, n, perTx, d.b.payload)
}

// connectorProps is the connector's configuration; password stands in for
// the database password, which is never printed.
func (d *debeziumPeer) connectorProps(password string) [][2]string {
	u, _ := url.Parse(d.db.url)
	props := [][2]string{
		{"name", "peers-debezium"},
		{"connector.class", "io.debezium.connector.postgresql.PostgresConnector"},
		{"tasks.max", "1"},
		{"database.hostname", u.Hostname()},
		{"database.port", u.Port()},
		{"database.user", u.User.Username()},
		{"database.password", password},
		{"database.dbname", strings.TrimPrefix(u.Path, "/")},
		{"topic.prefix", "peers_" + d.b.suffix},
		{"plugin.name", "pgoutput"},
		{"slot.name", d.db.slot},
		{"publication.name", "ferry"},
		{"publication.autocreate.mode", "disabled"},
		{"snapshot.mode", "no_data"},
		{"table.include.list", "public.outbox"},
	}
	props = append(props, debeziumConnector...)
	return append(props,
		[2]string{"transforms", "outbox"},
		[2]string{"transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter"},
		[2]string{"transforms.outbox.table.field.event.id", "id"},
		[2]string{"transforms.outbox.table.field.event.key", "aggregate_id"},
		[2]string{"transforms.outbox.table.field.event.type", "event_type"},
		[2]string{"transforms.outbox.table.field.event.payload", "payload"},
		[2]string{"transforms.outbox.route.by.field", "aggregate_type"},
		[2]string{"transforms.outbox.route.topic.replacement", strings.TrimSuffix(d.Topic(), ".load") + ".${routedByValue}"},
		[2]string{"transforms.outbox.table.fields.additional.placement", "event_type:header:event_type,aggregate_type:header:aggregate_type"},
	)
}

// workerProps is the Connect worker's configuration. The payload column is
// bytea: BinaryDataConverter passes its bytes through as the record value,
// as Debezium's outbox documentation advises for non-JSON payloads.
func (d *debeziumPeer) workerProps(restAddr string) [][2]string {
	props := [][2]string{
		{"bootstrap.servers", strings.Join(d.b.brokers, ",")},
		{"key.converter", "org.apache.kafka.connect.storage.StringConverter"},
		{"value.converter", "io.debezium.converters.BinaryDataConverter"},
		{"value.converter.delegate.converter.type", "org.apache.kafka.connect.json.JsonConverter"},
		{"value.converter.delegate.converter.type.schemas.enable", "false"},
		{"offset.storage.file.filename", filepath.Join(d.b.dir, "debezium.offsets")},
		{"listeners", "http://" + restAddr},
		// Connect's own advice at start ("All plugins have ServiceLoader
		// manifests"): skip scanning the classpath for plugins.
		{"plugin.discovery", "service_load"},
	}
	return append(props, debeziumWorker...)
}

func writeProps(file string, props [][2]string) error {
	var b strings.Builder
	for _, p := range props {
		fmt.Fprintf(&b, "%s=%s\n", p[0], p[1])
	}
	return os.WriteFile(file, []byte(b.String()), 0o600)
}

func (d *debeziumPeer) Start(ctx context.Context) (*process, error) {
	restAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(d.db.url)
	password, _ := u.User.Password()
	worker, connector := filepath.Join(d.b.dir, "worker.properties"), filepath.Join(d.b.dir, "connector.properties")
	if err := writeProps(worker, d.workerProps(restAddr)); err != nil {
		return nil, err
	}
	if err := writeProps(connector, d.connectorProps(password)); err != nil {
		return nil, err
	}
	// Ready reads the log: a start after a stop must not find the earlier
	// start's "Processing messages" in it.
	if err := os.Remove(filepath.Join(d.b.dir, "connect.log")); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	args := append([]string{}, d.b.jvmOpts...)
	args = append(args,
		"-Dlog4j2.configurationFile="+d.b.debeziumLog4j,
		"-Dconnect.log.file="+filepath.Join(d.b.dir, "connect.log"),
		"-cp", filepath.Join(d.b.debeziumLib, "*"),
		"org.apache.kafka.connect.cli.ConnectStandalone", worker, connector)
	return startProcess(filepath.Join(d.b.dir, "connect.out"), nil, d.b.java, args...)
}

// Ready is Debezium's own word that its streaming loop runs.
func (d *debeziumPeer) Ready(_ context.Context, _ *process) (bool, error) {
	return logHas(filepath.Join(d.b.dir, "connect.log"), "Processing messages"), nil
}

func (d *debeziumPeer) Confirmed(ctx context.Context) (string, bool, error) {
	return d.db.confirmed(ctx)
}

func (d *debeziumPeer) Offer(ctx context.Context, rate int, dur time.Duration, committed func(string, time.Time)) error {
	return d.db.offer(ctx, rate, dur, d.b.payload, committed)
}

func (d *debeziumPeer) Settings() string {
	var b strings.Builder
	b.WriteString("# Kafka Connect at Debezium 3.6.1.Final's own Kafka version (4.3.0), not the broker's 4.4.0: on connect-runtime 4.4.0 the task\n" +
		"# dies at start, NoClassDefFoundError: org/apache/kafka/common/utils/Sanitizer (4.4 moved it to ...utils.internals)\n")
	fmt.Fprintf(&b, "java %s -cp LIB/* org.apache.kafka.connect.cli.ConnectStandalone worker.properties connector.properties\n", strings.Join(d.b.jvmOpts, " "))
	b.WriteString("# worker.properties\n")
	for _, p := range d.workerProps("127.0.0.1:PORT") {
		if p[0] == "offset.storage.file.filename" {
			p[1] = "DIR/debezium.offsets"
		}
		fmt.Fprintf(&b, "%s=%s\n", p[0], p[1])
	}
	b.WriteString("# connector.properties\n")
	for _, p := range d.connectorProps("***") {
		switch p[0] {
		case "database.port", "database.dbname":
			p[1] = "..."
		}
		fmt.Fprintf(&b, "%s=%s\n", p[0], p[1])
	}
	return b.String()
}

func (d *debeziumPeer) Marks() string {
	var flush string
	for _, p := range debeziumWorker {
		if p[0] == "offset.flush.interval.ms" {
			flush = p[1]
		}
	}
	return fmt.Sprintf("Connect records the task's offsets every offset.flush.interval.ms (%s ms), then Debezium flushes that LSN to the slot", flush)
}
