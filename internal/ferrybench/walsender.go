package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/relay"
)

// The relay's START_REPLICATION plugin options (relay/session.go). The
// walsender ceiling must ask for exactly these: binary values and proto 1
// change what the walsender encodes, and so what it costs.
var relayPluginArgs = []string{"proto_version '1'", "publication_names '" + relay.PublicationDefault + "'", "binary 'true'"}

// promptReport is the relay's: how soon a moved confirmed position is
// reported (relay/session.go).
const promptReport = 10 * time.Millisecond

// A discarding client streams slot with the relay's plugin options and
// throws every change away; it confirms as the relay does when nothing
// waits on Kafka (confirmer). Each is timed as drainOnce times the relay,
// from connecting until the slot's confirmed_flush_lsn reaches target.
//
// How the client reads changes what the walsender pays per event, from
// about 8 to about 15 µs of its core here: on loopback the sender of each
// message also runs the receiver's side of TCP, and wakes the receiver when
// it waits in a read. A client that reads each message as it comes
// (pg_recvlogical, pglogrepl) keeps the walsender at the dear end; the
// relay, busy with Kafka between its reads, mostly finds it at the cheap
// end.
//
// batchedOnce, the primary ceiling, reads as a busy client does: a receive
// buffer of batchedReadBuffer, read whole, and a pause of batchedPause after
// any read that did not fill it, so that the walsender's messages wait in
// the socket rather than wake the reader one by one (of the buffers and
// pauses tried, 32 KiB to 256 KiB and 0.3 to 5 ms, this kept the walsender
// cheapest and busiest). walsenderOnce, a second line, reads one message at
// a time through pgconn.
const (
	batchedReadBuffer = 64 << 10
	batchedPause      = 500 * time.Microsecond
)

func batchedOnce(ctx context.Context, url string, pool *pgxpool.Pool, slot, target string) (drained, error) {
	return streamOnce(ctx, url, pool, slot, target, func(ctx context.Context, conn *pgconn.PgConn, from pglogrepl.LSN) error {
		hj, err := conn.Hijack()
		if err != nil {
			return err
		}
		nc := hj.Conn
		if tc, ok := nc.(*net.TCPConn); ok {
			if err := tc.SetReadBuffer(batchedReadBuffer); err != nil {
				return fmt.Errorf("set the receive buffer: %w", err)
			}
		}
		defer nc.Close()
		stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
		defer stop()
		q := fmt.Sprintf("START_REPLICATION SLOT %s LOGICAL 0/0 (%s)", pgx.Identifier{slot}.Sanitize(), strings.Join(relayPluginArgs, ", "))
		msg, err := (&pgproto3.Query{String: q}).Encode(nil)
		if err != nil {
			return err
		}
		if _, err := nc.Write(msg); err != nil {
			return fmt.Errorf("start replication on slot %q: %w", slot, err)
		}
		return discardBatched(ctx, nc, from)
	})
}

func walsenderOnce(ctx context.Context, url string, pool *pgxpool.Pool, slot, target string) (drained, error) {
	return streamOnce(ctx, url, pool, slot, target, func(ctx context.Context, conn *pgconn.PgConn, from pglogrepl.LSN) error {
		if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: relayPluginArgs}); err != nil {
			return fmt.Errorf("start replication on slot %q: %w", slot, err)
		}
		stop := context.AfterFunc(ctx, func() { _ = conn.Conn().Close() })
		defer stop()
		return discard(ctx, conn, from)
	})
}

// streamOnce connects for replication and times stream, which starts the
// stream on conn and reads it until ctx ends, until slot confirmed target.
func streamOnce(ctx context.Context, url string, pool *pgxpool.Pool, slot, target string,
	stream func(ctx context.Context, conn *pgconn.PgConn, from pglogrepl.LSN) error) (drained, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return drained{}, err
	}
	cfg.RuntimeParams["replication"] = "database"
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
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- stream(sctx, conn, from) }()
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

// discardBatched reads the raw protocol from nc until ctx ends: large
// reads, each followed by a pause unless it filled most of a chunk.
func discardBatched(ctx context.Context, nc net.Conn, confirmed pglogrepl.LSN) error {
	c := newConfirmer(confirmed)
	buf := make([]byte, 4*batchedReadBuffer)
	filled := 0
	for ctx.Err() == nil {
		now := time.Now()
		if send, periodic := c.due(now); send {
			if _, err := nc.Write(encodeStatus(c.status(now, periodic))); err != nil {
				return fmt.Errorf("send standby status: %w", err)
			}
		}
		_ = nc.SetReadDeadline(c.deadline(now))
		n, err := nc.Read(buf[filled:])
		filled += n
		// Backend messages: type (1), length including itself (4), body.
		off := 0
		for filled-off >= 5 {
			size := 1 + int(binary.BigEndian.Uint32(buf[off+1:off+5]))
			if filled-off < size {
				break
			}
			body := buf[off+5 : off+size]
			switch buf[off] {
			case 'd': // CopyData
				if err := c.copyData(body); err != nil {
					return err
				}
			case 'E':
				var e pgproto3.ErrorResponse
				if err := e.Decode(body); err != nil {
					return fmt.Errorf("replication stream: undecodable error: %w", err)
				}
				return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(&e))
			}
			off += size
		}
		filled = copy(buf, buf[off:filled])
		if filled >= 5 { // a message larger than the buffer: grow it
			if size := 1 + int(binary.BigEndian.Uint32(buf[1:5])); size > len(buf) {
				buf = append(buf[:filled], make([]byte, size-filled)...)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			return fmt.Errorf("read the replication stream: %w", err)
		}
		if n < batchedReadBuffer {
			time.Sleep(batchedPause)
		}
	}
	return nil
}

// encodeStatus is a standby status update as a CopyData message.
func encodeStatus(u pglogrepl.StandbyStatusUpdate) []byte {
	b := []byte{'d', 0, 0, 0, 0, pglogrepl.StandbyStatusUpdateByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(u.WALWritePosition))
	b = binary.BigEndian.AppendUint64(b, uint64(u.WALFlushPosition))
	b = binary.BigEndian.AppendUint64(b, uint64(u.WALApplyPosition))
	b = binary.BigEndian.AppendUint64(b, uint64(u.ClientTime.Sub(pgEpoch).Microseconds()))
	reply := byte(0)
	if u.ReplyRequested {
		reply = 1
	}
	b = append(b, reply)
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-1))
	return b
}

// pgEpoch is where PostgreSQL's timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// discard reads the replication stream until ctx ends, one message at a
// time as pgconn hands them over, and throws every change away, keeping only
// what a status update needs.
func discard(ctx context.Context, conn *pgconn.PgConn, confirmed pglogrepl.LSN) error {
	c := newConfirmer(confirmed)
	for ctx.Err() == nil {
		now := time.Now()
		if send, periodic := c.due(now); send {
			if err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, c.status(now, periodic)); err != nil {
				return fmt.Errorf("send standby status: %w", err)
			}
		}
		_ = conn.Conn().SetReadDeadline(c.deadline(now))
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
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := c.copyData(msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		}
	}
	return nil
}

// confirmer is what a discarding client keeps to confirm as the relay does
// when nothing waits on Kafka: the end of each commit received, reported at
// once (at most every promptReport) and at every status interval, and a
// keepalive's WAL end between transactions.
type confirmer struct {
	received, confirmed, reported pglogrepl.LSN
	open                          bool // inside a transaction: a keepalive's WAL end is not confirmable
	lastReport, nextStatus        time.Time
}

func newConfirmer(confirmed pglogrepl.LSN) *confirmer {
	return &confirmer{received: confirmed, confirmed: confirmed, nextStatus: time.Now()}
}

// due says whether a status update goes out now, and whether it is the
// periodic one (which asks for a reply).
func (c *confirmer) due(now time.Time) (send, periodic bool) {
	periodic = !now.Before(c.nextStatus)
	moved := c.confirmed != c.reported
	return periodic || (moved && now.Sub(c.lastReport) >= promptReport), periodic
}

// status is the update to send now; it counts as sent.
func (c *confirmer) status(now time.Time, periodic bool) pglogrepl.StandbyStatusUpdate {
	u := pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(c.received, c.confirmed),
		WALFlushPosition: c.confirmed,
		WALApplyPosition: c.confirmed,
		ClientTime:       now,
		ReplyRequested:   periodic || !c.open,
	}
	c.reported, c.lastReport = c.confirmed, now
	if periodic {
		c.nextStatus = now.Add(relay.StatusIntervalDefault)
	}
	return u
}

// deadline is how long a read may wait before the next status update is
// due.
func (c *confirmer) deadline(now time.Time) time.Time {
	if prompt := c.lastReport.Add(promptReport); c.confirmed != c.reported && prompt.Before(c.nextStatus) {
		return prompt
	}
	return c.nextStatus
}

// copyData takes one CopyData payload of the replication stream.
func (c *confirmer) copyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		if !c.open && ka.ServerWALEnd > c.confirmed {
			c.confirmed = ka.ServerWALEnd
		}
		if ka.ReplyRequested {
			c.nextStatus = time.Now()
		}
	case pglogrepl.XLogDataByteID:
		// XLogData: 'w', WAL start, WAL end, send time (8 bytes each),
		// then one pgoutput message.
		if len(data) < 25 {
			return errors.New("short XLogData")
		}
		wal := data[25:]
		if end := pglogrepl.LSN(binary.BigEndian.Uint64(data[1:9])) + pglogrepl.LSN(len(wal)); end > c.received {
			c.received = end
		}
		switch {
		case len(wal) == 0:
		case wal[0] == byte(pglogrepl.MessageTypeBegin):
			c.open = true
		case wal[0] == byte(pglogrepl.MessageTypeCommit) && len(wal) >= 18:
			// Commit: flags (1), commit LSN (8), end LSN (8), time.
			c.open = false
			c.confirmed = max(c.confirmed, pglogrepl.LSN(binary.BigEndian.Uint64(wal[10:18])))
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
}

// walsenderBusy is the walsender's share of one core.
func (d drained) walsenderBusy() float64 { return d.cpu / d.elapsed.Seconds() }

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
			d.cpu = cpuSeconds(int(pid))
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
