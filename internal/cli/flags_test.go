package cli

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// A setting comes from its flag, else from FERRY_<NAME>, else its default;
// a malformed variable is a usage error naming it; flags registered on the
// bare FlagSet never read the environment.
func TestFlagsReadTheEnvironment(t *testing.T) {
	t.Setenv("FERRY_MAX_IN_FLIGHT", "7")
	t.Setenv("FERRY_TOPIC_TEMPLATE", "from-env")
	t.Setenv("FERRY_RETENTION", "3d")
	t.Setenv("FERRY_SLOT", "") // empty is unset
	t.Setenv("FERRY_ALL", "true")
	f := NewFlags("test", io.Discard)
	n := f.Int("max-in-flight", 1, "")
	topic := f.String("topic-template", "default", "")
	retention := f.Duration("retention", time.Hour, "")
	slot := f.String("slot", "ferry", "")
	all := f.FlagSet.Bool("all", false, "")
	if err := f.Parse([]string{"--topic-template", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if *n != 7 || *topic != "from-flag" || *retention != 72*time.Hour || *slot != "ferry" || *all {
		t.Errorf("got max-in-flight %d, topic %q, retention %s, slot %q, all %v; want 7, from-flag, 72h, ferry, false",
			*n, *topic, *retention, *slot, *all)
	}

	t.Setenv("FERRY_MAX_IN_FLIGHT", "seven")
	f = NewFlags("test", io.Discard)
	f.Int("max-in-flight", 1, "")
	err := f.Parse(nil)
	if !errors.Is(err, ErrUsage) || err == nil || !strings.Contains(err.Error(), "FERRY_MAX_IN_FLIGHT") {
		t.Errorf("malformed FERRY_MAX_IN_FLIGHT: %v, want a usage error naming it", err)
	}
	f = NewFlags("test", io.Discard)
	if err := f.Parse([]string{"--no-such-flag"}); !errors.Is(err, ErrUsage) {
		t.Errorf("unknown flag: %v, want a usage error", err)
	}
}

// Flags may come after a command's arguments, as in `migrate down
// --database-url B`: the flag package alone stops at the first argument and
// would leave --database-url to the environment, the wrong database. After
// "--" everything is an argument; an argument a command does not take is a
// usage error that names it.
func TestFlagsAfterArgumentsAreParsed(t *testing.T) {
	t.Setenv("FERRY_DATABASE_URL", "postgres://from-env/A")
	f := NewFlags("test", io.Discard)
	f.TakesArgs(2)
	url := f.String("database-url", "", "")
	yes := f.FlagSet.Bool("yes", false, "")
	if err := f.Parse([]string{"down", "--database-url", "postgres://from-flag/B", "--yes", "--", "--not-a-flag"}); err != nil {
		t.Fatal(err)
	}
	if *url != "postgres://from-flag/B" || !*yes || f.NArg() != 2 || f.Arg(0) != "down" || f.Arg(1) != "--not-a-flag" {
		t.Errorf("got database-url %q, yes %v, args %q; want the flags after the argument, args [down --not-a-flag]", *url, *yes, f.Args())
	}

	f = NewFlags("test", io.Discard)
	f.String("database-url", "", "")
	err := f.Parse([]string{"--database-url", "x", "stray"})
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), `"stray"`) {
		t.Errorf("an argument the command does not take: %v, want a usage error naming it", err)
	}
	f = NewFlags("test", io.Discard)
	f.TakesArgs(1)
	if err := f.Parse([]string{"down", "up"}); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), `"up"`) {
		t.Errorf("one argument too many: %v, want a usage error naming it", err)
	}
}
