package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// DurationValue is a duration flag that also accepts whole days ("14d").
// A Positive one refuses 0 and less.
type DurationValue struct {
	D        time.Duration
	Positive bool
}

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
	if v.Positive && d <= 0 {
		return fmt.Errorf("%q: must be positive", s)
	}
	v.D = d
	return nil
}

// ParseDuration reads a Go duration ("36h") or a whole number of days ("7d").
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: want a duration such as 168h or 7d", s)
		}
		// time.Duration counts nanoseconds in an int64: 106,751 days at most.
		// Beyond that the product would wrap around, to a negative or a
		// wrong window.
		if n > maxDays || n < -maxDays {
			return 0, fmt.Errorf("%q: longer than %dd, the longest duration there is", s, maxDays)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a duration such as 168h or 7d", s)
	}
	return d, nil
}

const maxDays = int64(math.MaxInt64 / (24 * time.Hour))

// BoolValue is a boolean flag whose refusal of a value says which values
// it takes: the flag package only says "parse error", which an operator
// who wrote FERRY_KAFKA_TLS=yes cannot act on.
type BoolValue struct{ B bool }

func (v *BoolValue) String() string {
	if v == nil {
		return "false"
	}
	return strconv.FormatBool(v.B)
}

// Set parses what strconv.ParseBool takes.
func (v *BoolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is not a boolean: want true or false (1, 0, t, f also work)", s)
	}
	v.B = b
	return nil
}

// IsBoolFlag lets the flag stand alone on the command line: --kafka-tls.
func (v *BoolValue) IsBoolFlag() bool { return true }

// IntValue is an int flag whose refusal of a value says what it takes.
type IntValue struct{ N int }

func (v *IntValue) String() string {
	if v == nil {
		return "0"
	}
	return strconv.Itoa(v.N)
}

// Set parses a whole number.
func (v *IntValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	if err != nil {
		return fmt.Errorf("%q: want a whole number", s)
	}
	v.N = int(n)
	return nil
}

// CountValue is an int flag of at least 1: a number of records, rows,
// transactions or attempts. An engine's Config reads 0 as "use the
// default", so a 0 let through would be replaced in silence.
type CountValue struct{ N int }

func (v *CountValue) String() string {
	if v == nil {
		return ""
	}
	return strconv.Itoa(v.N)
}

// Set parses a whole number of at least 1.
func (v *CountValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	if err != nil || n < 1 {
		return fmt.Errorf("%q: want a whole number, at least 1", s)
	}
	v.N = int(n)
	return nil
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
