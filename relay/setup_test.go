package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/relay"
)

func publicationExists(t *testing.T, db *ferrytest.DB, name string) bool {
	t.Helper()
	var exists bool
	err := db.Pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists)
	if err != nil {
		t.Fatal(err)
	}
	return exists
}

// Setup needs a database and two names, nothing of Kafka: it creates the
// publication and a pgoutput slot, and a second call changes nothing.
func TestSetupNeedsNoKafka(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t) // no brokers, no relay.Config
	slot := "ferry_" + ferrytest.Suffix()
	for range 2 {
		if err := relay.Setup(ctx, db.Pool, slot, "ferry_setup", nil); err != nil {
			t.Fatalf("Setup: %v", err)
		}
	}
	st, err := relay.Status(ctx, db.Pool, slot)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exists || st.Plugin != "pgoutput" || st.ConfirmedFlushLSN == "" || st.Quarantined != 0 {
		t.Fatalf("after Setup, Status = %+v; want a pgoutput slot with a confirmed position", st)
	}
	// Ferry recorded the slot it created, and says whether it is a
	// failover slot where the server has them (17+).
	wantFailover := ""
	var version int
	if err := db.Pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version >= 170000 {
		wantFailover = "yes"
	}
	if !st.Recorded || st.RecordedLSN == "" || st.Failover != wantFailover {
		t.Fatalf("after Setup, Status = %+v; want the slot recorded and failover %q", st, wantFailover)
	}
	// A recorded slot that is gone is reported as such, not as one that
	// `relay run` would create.
	if _, err := db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
		t.Fatal(err)
	}
	if st, err := relay.Status(ctx, db.Pool, slot); err != nil || st.Exists || !st.Recorded {
		t.Fatalf("after the slot was dropped, Status = %+v, %v; want it missing and recorded", st, err)
	}
	if !publicationExists(t, db, "ferry_setup") {
		t.Fatal("Setup did not create publication ferry_setup")
	}
}

// Setup rejects a name PostgreSQL would refuse (or Ferry could not quote
// safely) before touching the database, and its error names the argument
// and the value.
func TestSetupRejectsBadNames(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	for _, tc := range []struct{ slot, publication, want string }{
		{"Bad-Slot", "ferry_ok", `slot "Bad-Slot"`},
		{"ferry_" + ferrytest.Suffix(), "pub; DROP TABLE outbox", `publication "pub; DROP TABLE outbox"`},
	} {
		err := relay.Setup(ctx, db.Pool, tc.slot, tc.publication, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("Setup(%q, %q) = %v, want an error naming %s", tc.slot, tc.publication, err, tc.want)
		}
		// Status refuses a bad name as Setup does: ask PostgreSQL itself.
		var slots int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, tc.slot).Scan(&slots); err != nil || slots != 0 {
			t.Fatalf("after a refused Setup, %d slots named %q (%v); want none", slots, tc.slot, err)
		}
	}
	if publicationExists(t, db, "ferry_ok") {
		t.Fatal("a refused Setup created the publication")
	}
}
