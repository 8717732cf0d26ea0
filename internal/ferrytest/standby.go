package ferrytest

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Standby is a physical streaming standby of the stack's PostgreSQL, made by
// `scripts/stack pg-standby`: a copy of the whole cluster, every test
// database in it, that replays the primary's WAL until it is promoted. It
// has the primary's system identifier and none of its replication slots (on
// PostgreSQL 17 and later it keeps copies of the failover slots: its
// sync_replication_slots is on).
// Tests that make one carry the "faults" build tag: the copy starts with a
// checkpoint of the PostgreSQL every other test shares.
type Standby struct {
	// Name is its name in scripts/stack (pg-promote NAME, pg-standby-rm NAME).
	Name string
	// URL is its "ferry" database, as FERRY_TEST_DATABASE_URL is the primary's.
	URL string
	// Slot is the physical slot on the primary it streams from (its
	// primary_slot_name), on PostgreSQL 17 and later: a test names it in the
	// primary's synchronized_standby_slots. Empty before 17.
	Slot string
}

// NewStandby makes and starts a standby of the stack's PostgreSQL, streaming
// from it, and removes it when the test ends, failed or not.
func NewStandby(t testing.TB) *Standby {
	t.Helper()
	AdminURL(t) // skip with -short, fail without a stack, as every integration test
	s := &Standby{Name: "sb" + Suffix()}
	// Registered first: a copy that failed half-way is removed too.
	t.Cleanup(func() {
		if _, err := stackOutput(t, "pg-standby-rm", s.Name); err != nil {
			t.Errorf("remove standby %s: %v", s.Name, err)
		}
	})
	out, err := stackOutput(t, "pg-standby", s.Name)
	if err != nil {
		t.Fatalf("make a standby: %v", err)
	}
	if s.URL = exported(out, "FERRY_TEST_STANDBY_URL"); s.URL == "" {
		t.Fatalf("scripts/stack pg-standby printed no FERRY_TEST_STANDBY_URL:\n%s", out)
	}
	s.Slot = exported(out, "FERRY_TEST_STANDBY_SLOT")
	return s
}

// DatabaseURL returns the URL of database name on the standby.
func (s *Standby) DatabaseURL(name string) string { return replaceDatabase(s.URL, name) }

// Promote makes the standby a primary: it stops replaying the old primary's
// WAL, starts a new timeline and accepts writes. It returns once it does.
func (s *Standby) Promote(t testing.TB) {
	t.Helper()
	if _, err := stackOutput(t, "pg-promote", s.Name); err != nil {
		t.Fatalf("promote standby %s: %v", s.Name, err)
	}
}

// WaitReplayed waits until the standby has replayed the primary's WAL up to
// lsn (the primary's pg_current_wal_lsn() at some point), or fails the test
// after timeout.
func (s *Standby) WaitReplayed(t testing.TB, lsn string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("connect to standby %s: %v", s.Name, err)
	}
	defer conn.Close(context.Background())
	var replayed string
	for {
		var done bool
		err := conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn()::text, ''), coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn).
			Scan(&replayed, &done)
		if err == nil && done {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("standby %s replayed up to %q, not %s, within %s (err %v)", s.Name, replayed, lsn, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stackOutput runs scripts/stack with args and returns what it printed on
// stdout (its export lines); the error carries stderr.
func stackOutput(t testing.TB, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(RepoRoot(t), "scripts", "stack"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("scripts/stack %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// exported reads the value of `export NAME='value'` from scripts/stack's
// output (its values never contain a quote).
func exported(out, name string) string {
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export "+name+"="); ok {
			return strings.Trim(v, "'")
		}
	}
	return ""
}
