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

// A malformed boolean or number, in the environment or on the command
// line, is refused with the values the setting takes, not the flag
// package's bare "parse error".
func TestMalformedBooleanOrNumberNamesTheAcceptedValues(t *testing.T) {
	for _, c := range []struct {
		env, value string
		args       []string
		want       []string
	}{
		{"FERRY_KAFKA_TLS", "yes", nil, []string{"FERRY_KAFKA_TLS (--kafka-tls)", `"yes"`, "true or false"}},
		{"", "", []string{"--kafka-tls=on"}, []string{"-kafka-tls", `"on"`, "true or false"}},
		{"FERRY_MAX_IN_FLIGHT", "seven", nil, []string{"FERRY_MAX_IN_FLIGHT (--max-in-flight)", `"seven"`, "whole number"}},
	} {
		if c.env != "" {
			t.Setenv(c.env, c.value)
		}
		f := NewFlags("test", io.Discard)
		f.Bool("kafka-tls", false, "")
		f.Int("max-in-flight", 1, "")
		err := f.Parse(c.args)
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%s=%q %v: %v, want a usage error", c.env, c.value, c.args, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s=%q %v: %q, want it to say %s", c.env, c.value, c.args, err, w)
			}
		}
		if c.env != "" {
			t.Setenv(c.env, "")
		}
	}
	// --kafka-tls alone is still true.
	f := NewFlags("test", io.Discard)
	tls := f.Bool("kafka-tls", false, "")
	if err := f.Parse([]string{"--kafka-tls"}); err != nil || !*tls {
		t.Errorf("--kafka-tls: %v, %v; want true", *tls, err)
	}
}

// A setting whose empty value means something (and which its command
// refuses) takes an empty variable as that value, not as unset: the
// command refuses FERRY_DLQ_SUFFIX="" as it refuses --dlq-suffix "".
func TestAnEmptyVariableIsTheEmptyValueWhereEmptyMeansSomething(t *testing.T) {
	t.Setenv("FERRY_DLQ_SUFFIX", "")
	t.Setenv("FERRY_SLOT", "")
	f := NewFlags("test", io.Discard)
	suffix := f.StringEmptyIsValue("dlq-suffix", ".dlq", "")
	slot := f.String("slot", "ferry", "")
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if *suffix != "" || *slot != "ferry" {
		t.Errorf("FERRY_DLQ_SUFFIX='' and FERRY_SLOT='': dlq-suffix %q, slot %q; want \"\" (set) and ferry (unset)", *suffix, *slot)
	}
}
