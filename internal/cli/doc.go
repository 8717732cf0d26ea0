// Package cli is what the relay's and the worker's command lines share, so
// that both behave alike: subcommand dispatch and its exit codes (0 done,
// 1 failed, 2 a wrong command line), flags that each have a FERRY_*
// environment variable and refuse a malformed value by name, the database
// and Kafka settings (TLS, SASL, with the password from the environment
// only), logging (tint on a terminal, JSON otherwise), the probe and
// metrics server, OpenTelemetry tracing and the migrate subcommand.
//
// The engines (relay, inbox) never import it: they take a Config, and the
// command lines build it from these flags.
package cli
