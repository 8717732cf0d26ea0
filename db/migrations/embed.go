// Package migrations embeds Ferry's goose SQL migrations so that every binary
// carries the schema it expects. Apply them with package schema.
package migrations

import "embed"

// FS holds the numbered goose migrations of Ferry's tables.
//
//go:embed *.sql
var FS embed.FS
