// Package reserva is an order and stock-reservation system built on Ferry,
// the example to copy when writing a worker of your own.
package reserva
