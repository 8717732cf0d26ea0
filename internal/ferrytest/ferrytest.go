// Package ferrytest gives tests real services: a fresh migrated PostgreSQL
// database and unique Kafka topics on the broker that scripts/stack started.
//
// Integration tests fail, rather than skip, when the services are missing;
// only `go test -short` skips them.
package ferrytest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/schema"
)

// Environment variables printed by `scripts/stack up`.
const (
	EnvDatabaseURL  = "FERRY_TEST_DATABASE_URL"
	EnvKafkaBrokers = "FERRY_TEST_KAFKA_BROKERS"
)

func need(t testing.TB, env string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("integration test: skipped with -short")
	}
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test", env)
	}
	return v
}

// AdminURL returns the URL of the stack's database, which tests use only to
// create and drop their own databases.
func AdminURL(t testing.TB) string { return need(t, EnvDatabaseURL) }

// Brokers returns the seed brokers of the stack's Kafka.
func Brokers(t testing.TB) []string { return strings.Split(need(t, EnvKafkaBrokers), ",") }

// Suffix returns a short random string for unique names.
func Suffix() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// Name turns a test name into a lowercase identifier with a random suffix.
func Name(t testing.TB, prefix string) string {
	base := unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 30 {
		base = base[len(base)-30:]
	}
	return strings.Trim(prefix+"_"+base, "_") + "_" + Suffix()
}

// DB is a fresh database holding Ferry's schema.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// SQL opens the database through database/sql (driver "pgx"), closed at the
// end of the test.
func (d *DB) SQL(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", d.URL)
	if err != nil {
		t.Fatalf("open database/sql: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// NewDB creates an empty database of its own for the test and drops it, with
// its replication slots, when the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	admin := AdminURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := Name(t, "t")
	url, err := CreateDatabase(ctx, admin, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := DropDatabase(admin, name); err != nil {
			t.Log(err)
		}
	})
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pool for %s: %v", name, err)
	}
	t.Cleanup(pool.Close)
	return &DB{Name: name, URL: url, Pool: pool}
}

// NewMigratedDB is NewDB with Ferry's migrations applied.
func NewMigratedDB(t testing.TB) *DB {
	t.Helper()
	d := NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := MigrateURL(ctx, d.URL); err != nil {
		t.Fatal(err)
	}
	return d
}

// NewPartitionedDB is NewMigratedDB with the outbox and the inbox
// partitioned by day (schema.PartitionOutbox, schema.PartitionInbox).
func NewPartitionedDB(t testing.TB) *DB {
	t.Helper()
	d := NewMigratedDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, part := range []func(context.Context, *sql.DB, schema.Partitioning) error{schema.PartitionOutbox, schema.PartitionInbox} {
		if err := part(ctx, d.SQL(t), schema.PartitionDaily); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// DayPartition creates the partition of table ("outbox", "inbox") for the
// UTC day of day, which the partitioned layout does not create for a past
// day, and returns its name.
func DayPartition(t testing.TB, d *DB, table string, day time.Time) string {
	t.Helper()
	tables := map[string]partition.Table{"outbox": partition.Outbox, "inbox": partition.Inbox}
	name, err := partition.CreateDay(context.Background(), d.Pool, tables[table], day)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// CreateDatabase creates database name next to the one admin points at and
// returns its URL.
func CreateDatabase(ctx context.Context, admin, name string) (string, error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w (is the stack up? `scripts/stack up`)", EnvDatabaseURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return replaceDatabase(admin, name), nil
}

// MigrateURL applies Ferry's migrations to the database at url.
func MigrateURL(ctx context.Context, url string) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := schema.Up(ctx, db); err != nil {
		return fmt.Errorf("migrate %s: %w", url, err)
	}
	return nil
}

// MainDB makes a migrated database for a TestMain, which has no testing.T.
// It returns the database's URL and a function that drops it.
func MainDB(prefix string) (url string, drop func(), err error) {
	if url, drop, err = MainEmptyDB(prefix); err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := MigrateURL(ctx, url); err != nil {
		drop()
		return "", nil, err
	}
	return url, drop, nil
}

// MainEmptyDB is MainDB without Ferry's migrations: for what applies them
// itself.
func MainEmptyDB(prefix string) (url string, drop func(), err error) {
	admin := os.Getenv(EnvDatabaseURL)
	if admin == "" {
		return "", nil, fmt.Errorf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test", EnvDatabaseURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := prefix + "_" + Suffix()
	if url, err = CreateDatabase(ctx, admin, name); err != nil {
		return "", nil, err
	}
	return url, func() { _ = DropDatabase(admin, name) }, nil
}

// ExamplesMain is the TestMain of a package whose examples, which have no
// testing.T, need a database: newDB (MainDB or MainEmptyDB) makes one
// named after prefix and its URL goes in DATABASE_URL. With -short the
// tests matching needsDB are skipped instead, and no database is made.
func ExamplesMain(m *testing.M, prefix, needsDB string, newDB func(prefix string) (string, func(), error)) {
	flag.Parse()
	if testing.Short() {
		_ = flag.Set("test.skip", needsDB)
		os.Exit(m.Run())
	}
	url, drop, err := newDB(prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("DATABASE_URL", url)
	code := m.Run()
	drop()
	os.Exit(code)
}

// replaceDatabase swaps the path of a postgres:// URL for name.
func replaceDatabase(url, name string) string {
	rest, query, _ := strings.Cut(url, "?")
	i := strings.LastIndex(rest, "/")
	out := rest[:i+1] + name
	if query != "" {
		out += "?" + query
	}
	return out
}

// DropDatabase drops database name and the replication slots that keep it
// alive.
func DropDatabase(admin, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	// A slot keeps its database alive; an active one must lose its walsender first.
	_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
	for range 50 {
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// Topic creates a topic of its own for the test with the given number of
// partitions and deletes it when the test ends.
func Topic(t testing.TB, partitions int32) string {
	t.Helper()
	name := strings.ReplaceAll(Name(t, "t"), "_", ".")
	CreateTopic(t, name, partitions)
	return name
}

// CreateTopic creates a named topic and deletes it when the test ends.
func CreateTopic(t testing.TB, name string, partitions int32) {
	t.Helper()
	CreateTopicConfig(t, name, partitions, nil)
}

// CreateTopicConfig is CreateTopic with topic configuration such as
// max.message.bytes.
func CreateTopicConfig(t testing.TB, name string, partitions int32, configs map[string]*string) {
	t.Helper()
	createTopic(t, Admin(t), name, partitions, configs)
}

// createTopic creates a topic through adm and deletes it when the test ends.
func createTopic(t testing.TB, adm *kadm.Client, name string, partitions int32, configs map[string]*string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	// CreateTopics returns once the controller has the topic; the broker
	// that answers metadata learns of it a moment later, and a loaded
	// machine stretches that moment. A client that asks in between hears
	// UNKNOWN_TOPIC_OR_PARTITION, which the relay treats as a missing topic:
	// the test gets its topic once metadata shows every partition led.
	for {
		tds, err := adm.ListTopics(ctx, name)
		if td, ok := tds[name]; err == nil && ok && td.Err == nil && (partitions <= 0 || int32(len(td.Partitions)) == partitions) && len(td.Partitions) > 0 && allLed(td) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s created but not in the broker's metadata after 30s (last error: %v)", name, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name)
	})
}

// allLed tells whether every partition of td has a leader.
func allLed(td kadm.TopicDetail) bool {
	for _, p := range td.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

// Admin returns a Kafka admin client closed when the test ends.
func Admin(t testing.TB) *kadm.Client {
	t.Helper()
	cl := Client(t)
	return kadm.NewClient(cl)
}

// Client returns a franz-go client on the stack's broker with extra options,
// closed when the test ends.
func Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return newClient(t, Brokers(t), opts)
}

// newClient returns a franz-go client on seeds, closed when the test ends.
func newClient(t testing.TB, seeds []string, opts []kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Context returns a context cancelled when the test ends or after d.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ExecUnflushed runs sql on one connection of pool with synchronous_commit
// off, so that a benchmark's backlog of many small transactions commits
// without waiting for each flush, and sets it back before the connection
// returns to the pool.
func ExecUnflushed(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.Background(), `RESET synchronous_commit`) }()
	_, err = conn.Exec(ctx, sql, args...)
	return err
}
