package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/internal/replsock"
	"github.com/ferryhq/ferry/relay"
)

// The relay's START_REPLICATION plugin options (relay/session.go). The
// walsender ceiling must ask for exactly these: binary values and proto 1
// change what the walsender encodes, and so what it costs.
var relayPluginArgs = []string{"proto_version '1'", "publication_names '" + relay.PublicationDefault + "'", "binary 'true'"}

// promptReport is the relay's: how soon a moved confirmed position is
// reported (relay/session.go).
const promptReport = 10 * time.Millisecond

// walsenderOnce is the relay's primary ceiling: the walsender streams slot
// with the relay's plugin options to a client that discards every change.
// It confirms as the relay does when nothing waits on Kafka: the end of
// each commit received, reported at once (at most every promptReport) and
// at every status interval, and a keepalive's WAL end between
// transactions. It is timed as drainOnce times the relay, from connecting
// until the slot's confirmed_flush_lsn reaches target.
func walsenderOnce(ctx context.Context, url string, pool *pgxpool.Pool, slot, target string) (drained, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return drained{}, err
	}
	cfg.RuntimeParams["replication"] = "database"
	// As the relay reads: in batches, with its default window (replsock).
	cfg.DialFunc = replsock.Dial(cfg.DialFunc, relay.ReadWindowDefault, nil)
	start := time.Now()
	// As the relay: start at LSN 0 (the slot's confirmed position), whose
	// value is the first status update's flush position.
	var text string
	if err := pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&text); err != nil {
		return drained{}, err
	}
	from, err := pglogrepl.ParseLSN(text)
	if err != nil {
		return drained{}, err
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return drained{}, fmt.Errorf("replication connection: %w", err)
	}
	defer conn.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: relayPluginArgs}); err != nil {
		return drained{}, fmt.Errorf("start replication on slot %q: %w", slot, err)
	}
	// As the relay runs: on one P (`relay run`'s default). With this
	// process's P per core the Go runtime keeps a thread spinning for
	// work beside the walsender, on the same two cores, and the client
	// would hold the walsender back more than the relay does.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- discard(sctx, conn, from) }()
	d, err := waitConfirmed(ctx, pool, slot, target, start, done)
	stop()
	if err != nil {
		return drained{}, err
	}
	if err := <-done; err != nil {
		return drained{}, err
	}
	return d, nil
}

// discard reads the replication stream until ctx ends and throws every
// change away, keeping only what a status update needs.
func discard(ctx context.Context, conn *pgconn.PgConn, confirmed pglogrepl.LSN) error {
	received, reported := confirmed, pglogrepl.LSN(0)
	open := false
	var lastReport time.Time
	nextStatus := time.Now()
	report := func(periodic bool) error {
		err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: max(received, confirmed),
			WALFlushPosition: confirmed,
			WALApplyPosition: confirmed,
			ClientTime:       time.Now(),
			ReplyRequested:   periodic || !open,
		})
		reported, lastReport = confirmed, time.Now()
		return err
	}
	for ctx.Err() == nil {
		now := time.Now()
		moved := confirmed != reported
		if periodic := !now.Before(nextStatus); periodic || (moved && now.Sub(lastReport) >= promptReport) {
			if err := report(periodic); err != nil {
				return fmt.Errorf("send standby status: %w", err)
			}
			nextStatus = now.Add(relay.StatusIntervalDefault)
			moved = false
		}
		deadline := nextStatus
		if moved {
			deadline = now.Add(promptReport)
		}
		_ = conn.Conn().SetReadDeadline(deadline)
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			if e, ok := msg.(*pgproto3.ErrorResponse); ok {
				return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(e))
			}
			continue
		}
		data := cd.Data
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			if !open && ka.ServerWALEnd > confirmed {
				confirmed = ka.ServerWALEnd
			}
			if ka.ReplyRequested {
				nextStatus = time.Now()
			}
		case pglogrepl.XLogDataByteID:
			// XLogData: 'w', WAL start, WAL end, send time (8 bytes each),
			// then one pgoutput message.
			if len(data) < 26 {
				return errors.New("short XLogData")
			}
			wal := data[25:]
			if end := pglogrepl.LSN(binary.BigEndian.Uint64(data[1:9])) + pglogrepl.LSN(len(wal)); end > received {
				received = end
			}
			switch {
			case len(wal) == 0:
			case wal[0] == byte(pglogrepl.MessageTypeBegin):
				open = true
			case wal[0] == byte(pglogrepl.MessageTypeCommit) && len(wal) >= 18:
				// Commit: flags (1), commit LSN (8), end LSN (8), time.
				open = false
				confirmed = max(confirmed, pglogrepl.LSN(binary.BigEndian.Uint64(wal[10:18])))
			}
		}
	}
	return nil
}

// drained is how one stream of the backlog went, the relay's or its
// ceiling's.
type drained struct {
	elapsed  time.Duration // from start until the slot confirmed the backlog's end
	attached time.Duration // from start until a walsender streamed from the slot (to the next poll)
	cpu      float64       // the walsender's CPU seconds
	wait     float64       // the walsender's seconds runnable but without a core (schedstat)
}

// walsenderBusy is the walsender's share of one core.
func (d drained) walsenderBusy() float64 { return d.cpu / d.elapsed.Seconds() }

// walsenderTime splits the time the walsender streamed (elapsed after it
// attached) into its shares on a core, runnable but waiting for one, and
// neither: waiting on its client's socket, for WAL or for I/O.
func (d drained) walsenderTime() (onCore, noCore, blocked float64) {
	streamed := (d.elapsed - d.attached).Seconds()
	if streamed <= 0 {
		return 0, 0, 0
	}
	onCore, noCore = d.cpu/streamed, d.wait/streamed
	return onCore, noCore, max(0, 1-onCore-noCore)
}

// waitConfirmed polls the slot every 20 ms until its confirmed_flush_lsn
// reaches target. The relay and its ceiling are timed by this same loop.
// exited reports the streaming side's end; an end before target is an
// error.
func waitConfirmed(ctx context.Context, pool *pgxpool.Pool, slot, target string, start time.Time, exited <-chan error) (drained, error) {
	var d drained
	var pid int32
	for {
		var done bool
		var active *int32
		if err := pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn, active_pid FROM pg_replication_slots WHERE slot_name = $1`,
			slot, target).Scan(&done, &active); err != nil {
			return d, err
		}
		if active != nil {
			if pid == 0 {
				d.attached = time.Since(start)
			}
			pid = *active
		}
		if done {
			d.elapsed = time.Since(start)
			// The walsender is a process of its own, forked for this
			// connection: all its CPU time is this stream's.
			d.cpu, d.wait = cpuSeconds(int(pid)), runQueueWait(int(pid))
			return d, nil
		}
		select {
		case err := <-exited:
			return d, fmt.Errorf("the stream from slot %s ended before %s: %v", slot, target, err)
		case <-ctx.Done():
			return d, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cpuSeconds is a process's user plus system time (0 when the process is
// gone or on another machine, e.g. PostgreSQL in a container elsewhere).
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	s, _ := procs.CPUSeconds(pid)
	return s
}

// runQueueWait is a process's time runnable without a core (0 when it
// cannot be read: see cpuSeconds).
func runQueueWait(pid int) float64 {
	if pid == 0 {
		return 0
	}
	s, _ := procs.RunQueueWait(pid)
	return s
}

// pgRecvlogical is PostgreSQL's own logical streaming client:
// FERRY_PG_CLIENT_BIN (scripts/stack's setting) or PostgreSQL 15's Debian
// directory, else the PATH.
func pgRecvlogical() (string, error) {
	for _, dir := range []string{os.Getenv("FERRY_PG_CLIENT_BIN"), "/usr/lib/postgresql/15/bin"} {
		if dir == "" {
			continue
		}
		if p := filepath.Join(dir, "pg_recvlogical"); fileExists(p) {
			return p, nil
		}
	}
	return exec.LookPath("pg_recvlogical")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// recvlogicalOnce is the walsender ceiling with PostgreSQL's own client:
// pg_recvlogical streams slot with the relay's plugin options into
// /dev/null and exits when it has received target (--endpos). It is timed
// from its start until it exits; the walsender's CPU is read every 20 ms
// while it streams (it exits with its client).
func recvlogicalOnce(ctx context.Context, bin, url string, pool *pgxpool.Pool, slot, target string) (drained, error) {
	args := []string{"-d", url, "--slot", slot, "--start", "--endpos", target, "--no-loop", "-f", "/dev/null"}
	for _, a := range relayPluginArgs {
		name, value, _ := strings.Cut(a, " ")
		args = append(args, "-o", name+"="+strings.Trim(value, "'"))
	}
	var d drained
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return d, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		var active *int32
		if err := pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active); err != nil {
			_ = cmd.Process.Kill()
			<-done
			return d, err
		}
		if active != nil {
			if d.attached == 0 {
				d.attached = time.Since(start)
			}
			d.cpu = max(d.cpu, cpuSeconds(int(*active)))
			d.wait = max(d.wait, runQueueWait(int(*active)))
		}
		select {
		case err := <-done:
			d.elapsed = time.Since(start)
			if err != nil {
				return d, fmt.Errorf("pg_recvlogical on slot %s: %v: %s", slot, err, strings.TrimSpace(stderr.String()))
			}
			return d, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}
