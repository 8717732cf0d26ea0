package workercmd

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
)

// durationValue is a duration flag that also accepts days ("14d"), since
// retention windows are counted in days.
type durationValue struct{ d time.Duration }

func durationFlag(fs *flag.FlagSet, name, env string, def time.Duration, usage string) *durationValue {
	v := &durationValue{d: def}
	if s := cli.Env(env, ""); s != "" {
		_ = v.Set(s) // a bad value keeps the default
	}
	fs.Var(v, name, usage)
	return v
}

func (v *durationValue) String() string {
	if v == nil {
		return ""
	}
	if v.d != 0 && v.d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(v.d/(24*time.Hour)), 10) + "d"
	}
	return v.d.String()
}

func (v *durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	v.d = d
	return nil
}

// parseDuration reads a Go duration or a whole number of days ("7d").
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, fmt.Errorf("%q: want a duration such as 168h or 7d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a duration such as 168h or 7d", s)
	}
	return d, nil
}

// timeValue is a point in time given as RFC 3339 ("2026-05-01T12:00:00Z")
// or as a duration before now ("2h", "7d").
type timeValue struct {
	t   time.Time
	now func() time.Time
}

func (v *timeValue) String() string {
	if v == nil || v.t.IsZero() {
		return ""
	}
	return v.t.Format(time.RFC3339)
}

func (v *timeValue) Set(s string) error {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		v.t = t
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: want an RFC 3339 time or a duration ago such as 24h or 7d", s)
	}
	now := time.Now
	if v.now != nil {
		now = v.now
	}
	v.t = now().Add(-d)
	return nil
}
