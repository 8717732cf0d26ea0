package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// watermillPeer is Watermill's SQL-to-Kafka forwarder, run by the
// watermill-peer binary of bench/peers/watermill (a module of its own, so
// Ferry's go.mod does not require Watermill). The forwarder reads its own
// table, not Ferry's outbox: the backlog and the offered events are written
// through Watermill's SQL publisher wrapped by the forwarder's publisher,
// the same count, payload, key and event headers.
type watermillPeer struct {
	b          *bench
	url        string
	pool       *pgxpool.Pool
	drop       func()
	fwdTopic   string // the forwarder's SQL topic: table watermill_<fwdTopic>
	lastOffset int64  // the backlog's last row
}

func (w *watermillPeer) Name() string {
	if w.b != nil && w.b.rabbit != nil {
		return "Watermill forwarder, watermill-amqp"
	}
	return "Watermill forwarder"
}
func (w *watermillPeer) Topic() string    { return w.b.topic("watermill") }
func (w *watermillPeer) IDHeader() string { return "_watermill_message_uuid" } // watermill-kafka's UUIDHeaderKey

func (w *watermillPeer) Prepare(ctx context.Context) error {
	url, drop, err := ferrytest.MainDB("peers_watermill")
	if err != nil {
		return err
	}
	w.url, w.drop, w.fwdTopic = url, drop, "peers_"+w.b.suffix
	w.pool, err = pgxpool.New(ctx, url)
	return err
}

func (w *watermillPeer) Close() {
	if w.pool != nil {
		w.pool.Close()
	}
	if w.drop != nil {
		w.drop()
	}
}

func (w *watermillPeer) run(ctx context.Context, verb string, extra ...string) *exec.Cmd {
	args := append([]string{verb, "-db", w.url, "-forwarder-topic", w.fwdTopic, "-topic", w.Topic(), "-payload", strconv.Itoa(w.b.payload)}, extra...)
	return exec.CommandContext(ctx, w.b.watermill, args...)
}

func (w *watermillPeer) WriteBacklog(ctx context.Context, n, perTx int) error {
	args := []string{"-events", strconv.Itoa(n), "-per-tx", strconv.Itoa(perTx)}
	if w.b.rabbit != nil {
		args = append(args, "-shard-keys", shardKeys())
	}
	if out, err := w.run(ctx, "backlog", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("watermill backlog: %v\n%s", err, out)
	}
	return w.pool.QueryRow(ctx, `SELECT max("offset") FROM `+w.table("watermill_")).Scan(&w.lastOffset)
}

func (w *watermillPeer) table(prefix string) string {
	return pgx.Identifier{prefix + w.fwdTopic}.Sanitize()
}

func (w *watermillPeer) Start(ctx context.Context) (*process, error) {
	if r := w.b.rabbit; r != nil {
		return startProcess(filepath.Join(w.b.dir, "watermill.log"), r.env(), w.b.watermill,
			"forward", "-db", w.url, "-amqp-url", r.conn.URL, "-forwarder-topic", w.fwdTopic)
	}
	return startProcess(filepath.Join(w.b.dir, "watermill.log"), nil, w.b.watermill,
		"forward", "-db", w.url, "-brokers", strings.Join(w.b.brokers, ","), "-forwarder-topic", w.fwdTopic)
}

// Ready is the forwarder's router running, which the binary prints.
func (w *watermillPeer) Ready(_ context.Context, p *process) (bool, error) {
	b, err := os.ReadFile(p.logFile)
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "ready" {
			return true, nil
		}
	}
	return false, nil
}

// Confirmed is the forwarder's offsets row: the last offset acked by the
// one consumer group (the empty name).
func (w *watermillPeer) Confirmed(ctx context.Context) (string, bool, error) {
	var acked int64
	err := w.pool.QueryRow(ctx, `SELECT offset_acked FROM `+w.table("watermill_offsets_")+` WHERE consumer_group = ''`).Scan(&acked)
	if err == pgx.ErrNoRows {
		return "0", false, nil
	}
	return strconv.FormatInt(acked, 10), err == nil && acked >= w.lastOffset, err
}

// Offer runs the binary's writer, which prints "<uuid> <unix ns>" when each
// event's commit returned.
func (w *watermillPeer) Offer(ctx context.Context, rate int, dur time.Duration, committed func(string, time.Time)) error {
	cmd := w.run(ctx, "write", "-rate", strconv.Itoa(rate), "-writers", strconv.Itoa(writersFor(rate)), "-for", dur.String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		id, ns, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil {
			continue
		}
		committed(id, time.Unix(0, n))
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("watermill write: %v\n%s", err, stderr.String())
	}
	return nil
}

func (w *watermillPeer) Settings() string {
	out, err := exec.Command(w.b.watermill, "settings").Output()
	if err != nil {
		return "unknown: " + err.Error() + "\n"
	}
	return "watermill-peer forward (bench/peers/watermill)\n" + string(out)
}

func (w *watermillPeer) Marks() string {
	return "an UPSERT of its offsets row (watermill_offsets_<topic>) once per polled batch, committed with the polling transaction"
}
