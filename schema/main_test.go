package schema_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// TestMain gives the examples, which have no *testing.T, an empty database
// of their own in DATABASE_URL: they apply the migrations themselves.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Examples need PostgreSQL; -short runs unit tests only.
		_ = flag.Set("test.skip", "^Example")
		os.Exit(m.Run())
	}
	admin := os.Getenv(ferrytest.EnvDatabaseURL)
	if admin == "" {
		fmt.Fprintf(os.Stderr, "%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test\n", ferrytest.EnvDatabaseURL)
		os.Exit(1)
	}
	name := "schema_example_" + ferrytest.Suffix()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	url, err := ferrytest.CreateDatabase(ctx, admin, name)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("DATABASE_URL", url)
	code := m.Run()
	if err := ferrytest.DropDatabase(admin, name); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}
