package schema_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// TestMain gives the examples, which have no *testing.T, an empty
// database in DATABASE_URL: they apply the migrations themselves.
func TestMain(m *testing.M) {
	ferrytest.ExamplesMain(m, "schema_example", "^Example", ferrytest.MainEmptyDB)
}
