// Package cli holds what Ferry's binaries share: settings from flags and
// environment, logging, the HTTP port for metrics and health, and signals.
package cli

import (
	"net/url"
	"os"
	"strconv"
	"time"
)

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// EnvBool is Env for booleans; an unparsable value keeps def and is caught
// by the flag parser when given as a flag.
func EnvBool(name string, def bool) bool {
	if b, err := strconv.ParseBool(os.Getenv(name)); err == nil {
		return b
	}
	return def
}

// EnvInt is Env for integers.
func EnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// EnvDuration is Env for durations such as "30s".
func EnvDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

// RedactURL hides the password of a postgres:// URL so it can be logged.
// Key=value connection strings are replaced whole when they hold a password.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "<connection string>"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "redacted")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "redacted")
		u.RawQuery = q.Encode()
	}
	return u.String()
}
