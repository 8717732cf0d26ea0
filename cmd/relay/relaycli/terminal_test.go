package relaycli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// `relay quarantine list` shows event data without handing its control and
// escape bytes to the terminal (ESC ] 0 ; ... BEL retitles the window, ESC
// [ 2 J clears it): they are escaped. A 10 KB value is cut, so that the
// table stays a table.
func TestQuarantineListEscapesEventData(t *testing.T) {
	db := ferrytest.NewMigratedDB(t)
	t.Setenv("FERRY_DATABASE_URL", db.URL)
	ctx := context.Background()
	hostile := "outbox.event.\x1b]0;pwned\x07"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox_quarantine (id, aggregate_type, aggregate_id, event_type, payload, created_at, topic, reason, error)
		VALUES ($1, 'a', '1', 'E', '', now(), $2, 'invalid_record', $3)`,
		uuid.New(), hostile+strings.Repeat("t", 10_000), "refused\x1b[2J\r\nFAKE\tLINE\u202e"); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, ctx, "quarantine", "list")
	if code != 0 {
		t.Fatalf("relay quarantine list: exit %d\n%s\n%s", code, out, stderr)
	}
	terminalSafe(t, out, 400)
	for _, want := range []string{`outbox.event.\x1b]0;pwned\a`, `refused\x1b[2J\r\nFAKE\tLINE\u202e`} {
		if !strings.Contains(out, want) {
			t.Errorf("the list does not show %s escaped:\n%s", want, out)
		}
	}
}

// terminalSafe fails unless out holds no control byte but newlines, and no
// line longer than maxLine bytes.
func terminalSafe(t *testing.T, out string, maxLine int) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if len(line) > maxLine {
			t.Errorf("line %d is %d bytes long, want at most %d: %.200q...", i+1, len(line), maxLine, line)
		}
		for _, r := range line {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u202e' {
				t.Errorf("line %d holds the raw control character %U: %.200q", i+1, r, line)
				break
			}
		}
	}
}
