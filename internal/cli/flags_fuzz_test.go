package cli

import (
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzSetting is one kind of setting under FuzzFlagValues: how to register
// it, and what an accepted value must have become.
type fuzzSetting struct {
	name  string
	env   bool // read from FERRY_<NAME> as well
	reg   func(f *Flags) func() any
	check func(t *testing.T, s string, got any)
}

var fuzzNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func fuzzSettings() []fuzzSetting {
	intLike := func(min int64) func(t *testing.T, s string, got any) {
		return func(t *testing.T, s string, got any) {
			n, err := strconv.ParseInt(s, 0, strconv.IntSize)
			if err != nil || n < min || int64(got.(int)) != n {
				t.Fatalf("%q accepted as %d, want a whole number of at least %d", s, got, min)
			}
		}
	}
	duration := func(positive bool) func(t *testing.T, s string, got any) {
		return func(t *testing.T, s string, got any) {
			d := got.(time.Duration)
			if days, ok := strings.CutSuffix(s, "d"); ok {
				n, err := strconv.ParseInt(days, 10, 64)
				if err != nil || d%(24*time.Hour) != 0 || int64(d/(24*time.Hour)) != n {
					t.Fatalf("%q accepted as %v, want %q days", s, d, days)
				}
			} else if want, err := time.ParseDuration(s); err != nil || d != want {
				t.Fatalf("%q accepted as %v, time.ParseDuration reads %v (%v)", s, d, want, err)
			}
			if positive && d <= 0 {
				t.Fatalf("%q accepted as %v, want a positive duration", s, d)
			}
			// The help prints the default with String: it must read back.
			v := &DurationValue{}
			if err := v.Set((&DurationValue{D: d}).String()); err != nil || v.D != d {
				t.Fatalf("%v prints as %q, which reads back as %v (%v)", d, (&DurationValue{D: d}).String(), v.D, err)
			}
		}
	}
	return []fuzzSetting{
		{"max-in-flight", true, func(f *Flags) func() any {
			p := f.Int("max-in-flight", 5, "")
			return func() any { return *p }
		}, intLike(math.MinInt)},
		{"concurrency", true, func(f *Flags) func() any {
			p := f.Count("concurrency", 5, "")
			return func() any { return *p }
		}, intLike(1)},
		{"retention", true, func(f *Flags) func() any {
			p := f.Duration("retention", time.Hour, "")
			return func() any { return *p }
		}, duration(false)},
		{"handler-timeout", true, func(f *Flags) func() any {
			p := f.PositiveDuration("handler-timeout", time.Minute, "")
			return func() any { return *p }
		}, duration(true)},
		{"kafka-tls", true, func(f *Flags) func() any {
			p := f.Bool("kafka-tls", false, "")
			return func() any { return *p }
		}, func(t *testing.T, s string, got any) {
			if b, err := strconv.ParseBool(s); err != nil || b != got.(bool) {
				t.Fatalf("%q accepted as %v, strconv.ParseBool reads %v (%v)", s, got, b, err)
			}
		}},
		{"kafka-brokers", true, func(f *Flags) func() any {
			var k Kafka
			k.Register(f, "test")
			return func() any { return &k }
		}, func(t *testing.T, s string, got any) {
			k := got.(*Kafka)
			if err := k.Validate(); err != nil {
				if !errors.Is(err, ErrUsage) || !strings.Contains(withoutValue(err, s), "--kafka-brokers") {
					t.Fatalf("brokers %q refused by %q, want a usage error naming --kafka-brokers", s, err)
				}
				return
			}
			bs := k.SeedBrokers()
			if len(bs) == 0 {
				t.Fatalf("brokers %q accepted with no broker", s)
			}
			for _, b := range bs {
				if b == "" || b != strings.TrimSpace(b) || strings.Contains(b, ",") || !strings.Contains(b, ":") {
					t.Fatalf("brokers %q accepted with broker %q", s, b)
				}
			}
		}},
		{"since", false, func(f *Flags) func() any {
			v := &TimeValue{Now: func() time.Time { return fuzzNow }}
			f.FlagSet.Var(v, "since", "")
			return func() any { return v.T }
		}, func(t *testing.T, s string, got any) {
			if _, err := time.Parse(time.RFC3339Nano, s); err == nil {
				return
			}
			if d, err := ParseDuration(s); err != nil || !got.(time.Time).Equal(fuzzNow.Add(-d)) {
				t.Fatalf("%q accepted as %v, want an RFC 3339 time or a duration before %v", s, got, fuzzNow)
			}
		}},
	}
}

// withoutValue is err's text with the value it quotes taken out, so that a
// value that happens to contain a flag's name cannot stand in for it.
func withoutValue(err error, s string) string {
	return strings.ReplaceAll(err.Error(), strconv.Quote(s), "")
}

// Every kind of setting (int, count, duration, positive duration, bool,
// the broker list, a time), given any value on the command line or in its
// FERRY_* variable: parsing never panics; a refused value is a usage error
// that names the flag or the variable it came from; an accepted one is
// what the value says (an empty variable counts as unset).
func FuzzFlagValues(f *testing.F) {
	for _, s := range []string{
		"", "0", "1", "-1", "7", "0x10", "abc", "2147483647", "9223372036854775808", "-9223372036854775808", "1x", "36h", "7d", "-7d", "0d", "106752d",
		"-2562047h47m16.854775808s", "1.5h", "true", "yes", "T", "localhost:9092", "a:1, b:2,,", "host", " , ",
		"2026-05-01T12:00:00Z", "2026-05-01", "--kafka-brokers", "\x00", "d",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		t.Setenv(SASLPasswordEnv, "")
		settings := fuzzSettings()
		for _, st := range settings {
			env := EnvName(st.name)
			for _, fromEnv := range []bool{false, true} {
				if fromEnv && (!st.env || strings.ContainsRune(s, 0)) { // no variable holds a NUL
					continue
				}
				for _, other := range settings {
					t.Setenv(EnvName(other.name), "")
				}
				var args []string
				if fromEnv {
					t.Setenv(env, s)
				} else {
					args = []string{"--" + st.name + "=" + s}
				}
				fs := NewFlags("test", io.Discard)
				get := st.reg(fs)
				err := fs.Parse(args)
				if fromEnv && s == "" && err != nil {
					t.Fatalf("empty %s: %v, want it read as unset", env, err)
				}
				if err != nil {
					want := "-" + st.name
					if fromEnv {
						want = env
					}
					if !errors.Is(err, ErrUsage) || !strings.Contains(withoutValue(err, s), want) {
						t.Fatalf("%q refused by %q, want a usage error naming %s", s, err, want)
					}
					continue
				}
				if !(fromEnv && s == "") {
					st.check(t, s, get())
				}
			}
		}
	})
}
