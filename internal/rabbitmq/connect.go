package rabbitmq

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/kafkaauth"
)

// HeartbeatDefault is the connections' heartbeat: a broker or a peer that
// stops answering is given up after about two of them.
const HeartbeatDefault = 10 * time.Second

// Conn is how to reach a broker.
type Conn struct {
	// URL is amqp://user@host:port/vhost or amqps://...; it carries no
	// password.
	URL string
	// Password is the user's password (from the environment).
	Password string
	// Vhost, when set, replaces the URL's.
	Vhost string
	// TLS files for amqps: the CA that signs the broker's certificate, and
	// a client certificate and key (both or neither).
	TLS kafkaauth.TLSFiles
	// Name is the connection's name in the broker's management UI.
	Name string
	// Heartbeat defaults to HeartbeatDefault.
	Heartbeat time.Duration
}

// Names are how the caller's settings are called in errors.
type Names struct {
	URL, Password, Vhost, CA, CertKey string
}

// Check says why c cannot be dialed, naming the setting by n.
func (c *Conn) Check(n Names) error {
	if c.URL == "" {
		return fmt.Errorf("%s is empty", n.URL)
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("%s: %w", n.URL, err)
	}
	switch u.Scheme {
	case "amqp", "amqps":
	default:
		return fmt.Errorf("%s: scheme %q, want amqp or amqps", n.URL, u.Scheme)
	}
	if _, set := u.User.Password(); set {
		return fmt.Errorf("%s carries a password: put it in %s instead (a URL is logged and shown)", n.URL, n.Password)
	}
	if u.Host == "" {
		return fmt.Errorf("%s: no host", n.URL)
	}
	if u.Scheme == "amqp" && (c.TLS.CA != "" || c.TLS.Cert != "" || c.TLS.SkipVerify) {
		return fmt.Errorf("%s: TLS settings (%s, %s) need an amqps:// URL", n.URL, n.CA, n.CertKey)
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		return fmt.Errorf("%s: give both the certificate and the key, or neither", n.CertKey)
	}
	return nil
}

// Redacted is the URL without anything secret in it, for logs.
func (c *Conn) Redacted() string {
	u, err := url.Parse(c.URL)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = url.User(u.User.Username())
	if c.Vhost != "" {
		u.Path = "/" + url.PathEscape(c.Vhost)
	}
	return u.Redacted()
}

// User is the user name in the URL.
func (c *Conn) User() string {
	u, err := url.Parse(c.URL)
	if err != nil || u.User == nil {
		return ""
	}
	return u.User.Username()
}

// Dial connects, with automatic recovery off: a connection that fails is
// given up, and whoever used it starts again on a new one (a recovered
// channel would restart its confirm and delivery numbering under the same
// *amqp.Channel). Errors say what the broker refused without the password,
// naming the setting by n.
func (c *Conn) Dial(n Names) (*amqp.Connection, error) {
	if err := c.Check(n); err != nil {
		return nil, err
	}
	u, _ := url.Parse(c.URL)
	user := u.User.Username()
	u.User = url.UserPassword(user, c.Password)
	cfg := amqp.Config{
		Heartbeat:  c.Heartbeat,
		Properties: amqp.NewConnectionProperties(),
		Dial:       amqp.DefaultDial(30 * time.Second),
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = HeartbeatDefault
	}
	if c.Name != "" {
		cfg.Properties.SetClientConnectionName(c.Name)
	}
	if c.Vhost != "" {
		cfg.Vhost = c.Vhost
	}
	if u.Scheme == "amqps" {
		tc, err := kafkaauth.TLS(c.TLS, kafkaauth.Names{CA: n.CA, CertKey: n.CertKey})
		if err != nil {
			return nil, err
		}
		tc.ServerName = u.Hostname()
		cfg.TLSClientConfig = tc
	}
	conn, err := amqp.DialConfig(u.String(), cfg)
	if err != nil {
		return nil, c.explain(err, n)
	}
	return conn, nil
}

// explain turns a dial error into one that says what to fix. It never
// repeats the URL with its password: amqp091-go's errors do not carry it,
// and this one names only the redacted URL.
func (c *Conn) explain(err error, n Names) error {
	at := c.Redacted()
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ae *amqp.Error
	var ne net.Error
	switch {
	case errors.Is(err, amqp.ErrCredentials):
		return fmt.Errorf("rabbitmq %s refused user %q: wrong password (%s) or unknown user: %w", at, c.User(), n.Password, err)
	case errors.Is(err, amqp.ErrVhost):
		return fmt.Errorf("rabbitmq %s: user %q has no access to the vhost (%s): %w", at, c.User(), n.Vhost, err)
	case errors.As(err, &ua), strings.Contains(err.Error(), "certificate signed by unknown authority"):
		return fmt.Errorf("rabbitmq %s: the broker's certificate is not signed by a trusted CA (set %s): %w", at, n.CA, err)
	case errors.As(err, &hn):
		return fmt.Errorf("rabbitmq %s: the broker's certificate does not name the host in %s: %w", at, n.URL, err)
	case errors.As(err, &ae):
		return fmt.Errorf("rabbitmq %s: %w", at, err)
	case errors.As(err, &ne):
		return fmt.Errorf("rabbitmq %s: cannot connect: %w", at, err)
	}
	return fmt.Errorf("rabbitmq %s: %w", at, err)
}
