package migration_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// TestMain gives the examples, which have no *testing.T, a migrated database in
// DATABASE_URL.
func TestMain(m *testing.M) {
	ferrytest.ExamplesMain(m, "migration_example", "^ExampleController$", ferrytest.MainDB)
}
