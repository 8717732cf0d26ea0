package rabbitmq

import (
	"fmt"
	"strconv"

	"github.com/ferryhq/ferry/internal/route"
)

// ShardsDefault is the shard count of a channel that does not set one.
const ShardsDefault = 16

// MaxShards is the largest shard count: one shard per migration slice.
const MaxShards = route.Slices

// CheckShards says why n cannot be a shard count, nil when it can: a power
// of two from 1 to MaxShards, so that every migration slice lies in one
// shard.
func CheckShards(n int) error {
	if n < 1 || n > MaxShards || n&(n-1) != 0 {
		return fmt.Errorf("%d is not a power of two from 1 to %d", n, MaxShards)
	}
	return nil
}

// Shard returns the shard of an aggregate among shards: its migration slice
// (route.Slice) modulo shards. It is stable across processes and releases.
func Shard(aggregateID []byte, shards int) int {
	return route.Slice(aggregateID) % shards
}

// routingKeys are the routing keys of the shards, made once.
var routingKeys = func() [MaxShards]string {
	var ks [MaxShards]string
	for i := range ks {
		ks[i] = fmt.Sprintf("%03d", i)
	}
	return ks
}()

// RoutingKey is the routing key of a shard: three digits, "000" to "127",
// whatever the shard count, so a key never changes meaning.
func RoutingKey(shard int) string { return routingKeys[shard] }

// ParseRoutingKey returns the shard a routing key names.
func ParseRoutingKey(key string) (int, bool) {
	if len(key) != 3 {
		return 0, false
	}
	n, err := strconv.Atoi(key)
	if err != nil || n < 0 || n >= MaxShards {
		return 0, false
	}
	return n, true
}
