// Package readme keeps the docs true. Its test reads README.md,
// CONTRIBUTING.md and every docs/**/*.md and fails when a make target,
// script, command, subcommand or flag they show does not exist, when a
// relative link points at a missing file or heading, or when a page of
// docs/ cannot be reached from docs/README.md; README's Go snippets must
// compile against today's API. Commands lists every
// command and verb of the relay and the worker, and Help prints one's -h
// in process, for the test and for cmd/flagref, which writes
// docs/reference/ from them (make reference).
package readme
