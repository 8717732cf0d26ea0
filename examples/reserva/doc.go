// Package reserva is an order and stock-reservation system built on Ferry,
// the example to copy when writing services and workers of your own.
//
//   - The order service (Service, an HTTP JSON API) writes an order and its
//     OrderPlaced event in one transaction with outbox.Write. It bounds every
//     field (MaxItems and the other limits), so every order it accepts makes
//     events Kafka takes; it answers every bad request with a 4xx and a JSON
//     error; and an Idempotency-Key header, stored with the order in the same
//     transaction, makes a client's retry return the order it already placed.
//   - The stock-reservation worker (consumer "stock.reservation") reserves
//     each order's items and writes StockReserved or StockRejected through
//     the outbox in the same transaction as the reservation, so the chain
//     event -> effect -> event stays exactly-once.
//   - The order-status worker (consumer "order.status") moves the order to
//     reserved or rejected from those events.
//
// A malformed OrderPlaced ends in the dead-letter topic with its reason,
// never in a crash loop. Register adds both handlers to an inbox.Worker.
package reserva

import (
	"embed"
	"io/fs"

	"github.com/ferryhq/ferry/schema"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are reserva's tables, recorded in reserva_schema_version so they
// live beside Ferry's own migrations (ferry_schema_version).
var Migrations = schema.Set{FS: mustSub(migrationFiles, "migrations"), VersionTable: "reserva_schema_version"}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}
