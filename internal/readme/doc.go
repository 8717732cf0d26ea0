// Package readme holds the test that keeps README.md true: every make
// target, command, subcommand and flag it shows exists.
package readme
