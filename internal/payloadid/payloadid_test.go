package payloadid

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// The derived id is pinned: "sha256:" and the hex SHA-256 of the key's
// length (8 bytes, big-endian), the key and the value. Changing it would
// make a worker that reads both channels of a migration, or a worker of an
// older release, apply a record twice.
func TestOfIsPinned(t *testing.T) {
	t.Parallel()
	key, value := []byte("order-7"), []byte(`{"qty":3}`)
	sum := sha256.Sum256(append(append([]byte{0, 0, 0, 0, 0, 0, 0, byte(len(key))}, key...), value...))
	if got, want := Of(key, value), "sha256:"+hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("Of = %s, want %s", got, want)
	}
	// A value computed apart, so that a change to the formula and to the
	// test's own reconstruction at once still fails.
	if got, want := Of([]byte("k"), []byte("v")), "sha256:"+hexSum("\x00\x00\x00\x00\x00\x00\x00\x01kv"); got != want {
		t.Fatalf("Of(k, v) = %s, want %s", got, want)
	}
	if Of([]byte("ab"), []byte("c")) == Of([]byte("a"), []byte("bc")) {
		t.Fatal("moving a byte from the key to the value keeps the id")
	}
}

func hexSum(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestOfMessageIsPinned(t *testing.T) {
	t.Parallel()
	want := "sha256:" + hexSum("\x00\x00\x00\x00\x00\x00\x00\x06orders\x00\x00\x00\x00\x00\x00\x00\x03007{}")
	if got := OfMessage("orders", "007", []byte("{}")); got != want {
		t.Fatalf("OfMessage = %s, want %s", got, want)
	}
	if OfMessage("ab", "c", nil) == OfMessage("a", "bc", nil) {
		t.Fatal("moving a byte from the exchange to the routing key keeps the id")
	}
	if OfMessage("a", "b", []byte("c")) == OfMessage("a", "bc", nil) {
		t.Fatal("moving a byte from the routing key to the body keeps the id")
	}
}
