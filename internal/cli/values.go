package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DurationValue is a duration flag that also accepts whole days ("14d").
type DurationValue struct{ D time.Duration }

func (v *DurationValue) String() string {
	if v == nil {
		return ""
	}
	if v.D != 0 && v.D%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(v.D/(24*time.Hour)), 10) + "d"
	}
	return v.D.String()
}

// Set parses a Go duration or a whole number of days.
func (v *DurationValue) Set(s string) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	v.D = d
	return nil
}

// ParseDuration reads a Go duration ("36h") or a whole number of days ("7d").
func ParseDuration(s string) (time.Duration, error) {
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

// TimeValue is a point in time given as RFC 3339 ("2026-05-01T12:00:00Z")
// or as a duration before now ("2h", "7d").
type TimeValue struct {
	T   time.Time
	Now func() time.Time // time.Now when nil
}

func (v *TimeValue) String() string {
	if v == nil || v.T.IsZero() {
		return ""
	}
	return v.T.Format(time.RFC3339)
}

// Set parses an RFC 3339 time or a duration ago.
func (v *TimeValue) Set(s string) error {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		v.T = t
		return nil
	}
	d, err := ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: want an RFC 3339 time or a duration ago such as 24h or 7d", s)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	v.T = now().Add(-d)
	return nil
}
