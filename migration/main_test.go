package migration_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// TestMain gives the examples, which have no *testing.T, a migrated
// database in DATABASE_URL.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Examples need PostgreSQL; -short runs unit tests only.
		_ = flag.Set("test.skip", "^ExampleController$")
		os.Exit(m.Run())
	}
	url, drop, err := ferrytest.MainDB("migration_example")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("DATABASE_URL", url)
	code := m.Run()
	drop()
	os.Exit(code)
}
