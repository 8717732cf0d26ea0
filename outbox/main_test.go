package outbox_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// TestMain gives the examples, which have no *testing.T, a migrated database in
// DATABASE_URL.
func TestMain(m *testing.M) {
	ferrytest.ExamplesMain(m, "outbox_example", "^Example", ferrytest.MainDB)
}
