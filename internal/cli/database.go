package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Database is the --database-url setting.
type Database struct {
	URL string
}

// Register binds the setting to f.
func (d *Database) Register(f *Flags) {
	f.StringVar(&d.URL, "database-url", "", "PostgreSQL URL or key=value connection string")
}

// PoolConfig validates the setting and parses it, once. Its errors are usage
// errors that name the flag and never repeat the URL, which may hold a
// password.
func (d *Database) PoolConfig() (*pgxpool.Config, error) {
	if d.URL == "" {
		return nil, Usagef("--database-url (FERRY_DATABASE_URL) is required")
	}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		return nil, Usagef("--database-url is not a valid PostgreSQL connection string")
	}
	return cfg, nil
}

// Target names the database the setting points at, "database orders on
// db1:5432", so that a command that changes it says which one: a flag
// ignored or a stale environment variable must not go unnoticed. It never
// shows the password.
func (d *Database) Target() (string, error) {
	cfg, err := d.PoolConfig()
	if err != nil {
		return "", err
	}
	cc := cfg.ConnConfig
	hosts := []string{net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))}
	for _, fb := range cc.Fallbacks {
		hosts = append(hosts, net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port))))
	}
	return fmt.Sprintf("database %s on %s", cc.Database, strings.Join(hosts, ",")), nil
}

// Names are the user, database name and hosts of the setting, which the
// probe server's answers must not show (see Probes.Hide); nil when the
// setting does not parse.
func (d *Database) Names() []string {
	cfg, err := d.PoolConfig()
	if err != nil {
		return nil
	}
	cc := cfg.ConnConfig
	names := []string{cc.User, cc.Database, cc.Host}
	for _, fb := range cc.Fallbacks {
		names = append(names, fb.Host)
	}
	return names
}

// Validate is PoolConfig without the result.
func (d *Database) Validate() error {
	_, err := d.PoolConfig()
	return err
}

// Pool opens a pool on the database. It does not wait for a connection.
func (d *Database) Pool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := d.PoolConfig()
	if err != nil {
		return nil, err
	}
	return OpenPool(ctx, cfg)
}

// OpenPool opens a pool from a parsed configuration.
func OpenPool(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// Redacted is the URL with its password hidden, for logs. A key=value
// connection string is replaced whole.
func (d *Database) Redacted() string { return RedactURL(d.URL) }

// RedactURL hides the password of a postgres:// URL so it can be logged.
// Key=value connection strings are replaced whole.
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

// Base is what every subcommand that talks to PostgreSQL shares: the
// --database-url and --log-* settings.
type Base struct {
	DB  Database
	Log Log
}

// Register binds the settings to f.
func (b *Base) Register(f *Flags) {
	b.DB.Register(f)
	b.Log.Register(f)
}

// Parse parses args, validates both settings and returns the logger,
// which writes to stderr.
func (b *Base) Parse(f *Flags, args []string, stderr io.Writer) (*slog.Logger, error) {
	if err := f.Parse(args); err != nil {
		return nil, err
	}
	if err := b.DB.Validate(); err != nil {
		return nil, err
	}
	return b.Log.Logger(stderr)
}
