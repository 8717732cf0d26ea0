package rabbitmq

import (
	"fmt"
	"os"

	"github.com/ferryhq/ferry/internal/kafkaauth"
)

// PlanChannel is a live migration plan's RabbitMQ channel (a
// migration.Channel of kind rabbitmq) as the relay, the workers and the
// controller reach it: the plan holds no password, only the name of the
// variable that holds it wherever the plan is used.
type PlanChannel struct {
	Side        string // "old" or "new": names its settings in errors
	URL         string
	PasswordEnv string
	TLS         kafkaauth.TLSFiles
}

// Names are the channel's settings' names in errors.
func (c PlanChannel) Names() Names {
	return Names{
		URL: c.Side + " channel url", Password: c.Side + " channel password_env " + c.PasswordEnv, Vhost: c.Side + " channel url's vhost",
		CA: c.Side + " channel tls_ca_file", CertKey: c.Side + " channel tls_cert_file/tls_key_file",
	}
}

// Conn is how to reach the channel, the password read by getenv
// (os.Getenv when nil) from the variable PasswordEnv names; an empty or
// unset variable is an error that names it, never a value.
func (c PlanChannel) Conn(getenv func(string) string) (Conn, error) {
	conn := Conn{URL: c.URL, TLS: c.TLS}
	if err := conn.Check(c.Names()); err != nil {
		return Conn{}, err
	}
	if c.PasswordEnv == "" {
		return conn, nil
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	if conn.Password = getenv(c.PasswordEnv); conn.Password == "" {
		return Conn{}, fmt.Errorf("%s channel: the environment variable %s (password_env) is empty or unset", c.Side, c.PasswordEnv)
	}
	return conn, nil
}
