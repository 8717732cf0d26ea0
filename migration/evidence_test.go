package migration

import (
	"strings"
	"testing"
	"time"
)

// A report failing on lateness alone says by when the gate passes if no
// copy is late from then on: once the newest late event, or missing
// shadow, is older than the report's window. One that fails for another
// reason too, or whose late events the report does not date, does not
// promise anything.
func TestGateSaysWhenItPassesIfNothingElseIsLate(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	late := Report{Checked: 500, Aged: 400, Window: 2 * time.Minute, AllowedLateness: 30 * time.Second,
		P99Lateness: 48 * time.Second, MaxLateness: 50 * time.Second,
		Late: []LateMark{{time.Second, at.Add(-10 * time.Second)}, {5 * time.Second, at.Add(-20 * time.Second)},
			{20 * time.Second, at.Add(-30 * time.Second)}}}
	missing := late
	missing.P99Lateness, missing.Missing, missing.MissingNewest = time.Second, 3, at.Add(-5*time.Second)
	both := late
	both.Missing, both.MissingNewest = 3, at.Add(-40*time.Second)
	for _, tc := range []struct {
		name   string
		r      Report
		maxP99 time.Duration
		want   string
	}{
		// The newest event later than 10 s is no older than the newest
		// later than 5 s (20 s before at): the gate passes 2 minutes after.
		{"p99", late, 10 * time.Second, "passes by 2026-12-01T10:01:40Z"},
		{"p99 beyond a bound", late, 20 * time.Second, "passes by 2026-12-01T10:01:30Z"},
		{"missing", missing, 10 * time.Second, "passes by 2026-12-01T10:01:55Z"},
		{"both", both, 10 * time.Second, "passes by 2026-12-01T10:01:40Z"},
	} {
		err := tc.r.Gate(tc.maxP99)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--migration-report-window") {
			t.Errorf("%s: %v; want it to say the gate %s", tc.name, err, tc.want)
		}
	}
	mismatched := late
	mismatched.Mismatched = 1
	undated := late
	undated.Late = nil
	for name, r := range map[string]Report{"a mismatch too": mismatched, "undated": undated} {
		if err := r.Gate(10 * time.Second); err == nil || strings.Contains(err.Error(), "passes by") {
			t.Errorf("%s: %v; want a rejection that promises nothing", name, err)
		}
	}
	if err := late.Gate(time.Minute); err != nil {
		t.Errorf("p99 within the bound: %v", err)
	}
}

// A RabbitMQ old channel drains once it brought the group nothing to apply
// for OldQuiet before the report: not while its last work is more recent,
// and not from a worker that does not report the quiet it needs.
func TestOldQuietWaitsForTheWholeQuiet(t *testing.T) {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		r      Report
		refuse string
	}{
		{"no work since the worker started", Report{At: at, OldQuiet: 90 * time.Second}, ""},
		{"quiet for longer", Report{At: at, OldWorkedAt: at.Add(-91 * time.Second), OldQuiet: 90 * time.Second}, ""},
		{"quiet for exactly the quiet", Report{At: at, OldWorkedAt: at.Add(-90 * time.Second), OldQuiet: 90 * time.Second}, ""},
		{"work within the quiet", Report{At: at, OldWorkedAt: at.Add(-89 * time.Second), OldQuiet: 90 * time.Second},
			"1m29s before its report, and that channel must bring it nothing to apply for 1m30s"},
		{"work after the report began", Report{At: at, OldWorkedAt: at.Add(time.Second), OldQuiet: 90 * time.Second}, "-1s before its report"},
		{"a worker that reports no quiet", Report{At: at}, "upgrade the group's workers"},
	} {
		err := oldQuiet(c.r)
		if c.refuse == "" && err != nil || c.refuse != "" && (err == nil || !strings.Contains(err.Error(), c.refuse)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.refuse)
		}
	}
}
