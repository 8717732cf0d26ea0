// Package payloadid derives a message id from a record's key and value, for
// records that carry no id header. The inbox (inbox.Config.IDFromPayloadHash)
// and the migration bridge both use it: if they derived ids apart, a worker
// reading the old channel one way and the bridged channel the other would
// stop deduplicating the two copies and apply a record twice.
package payloadid

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// Of returns "sha256:" and the hex SHA-256 of the key's length (8 bytes,
// big-endian), the key and the value; the length prefix makes moving bytes
// between key and value change the id. It depends on nothing but those
// bytes, so a replay, a restart and the other cluster all derive the same
// id; it is never taken from an offset, which differs between clusters and
// between a replay and the original. Two distinct messages with the same
// key and the same value share the id: a consumer applies only one of them.
func Of(key, value []byte) string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(key)))
	h.Write(n[:])
	h.Write(key)
	h.Write(value)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// OfMessage is the id of an AMQP message that carries none: "sha256:" and
// the hex SHA-256 of the exchange and the routing key, each after its
// length (8 bytes, big-endian), and the body. A worker reading the message
// from RabbitMQ and the bridge copying it to another channel both derive
// it, from what every delivery of the message has in common (never the
// delivery tag or the redelivered flag).
func OfMessage(exchange, routingKey string, body []byte) string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(exchange)))
	h.Write(n[:])
	h.Write([]byte(exchange))
	binary.BigEndian.PutUint64(n[:], uint64(len(routingKey)))
	h.Write(n[:])
	h.Write([]byte(routingKey))
	h.Write(body)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
