package rabbitmq

import (
	"fmt"
	"testing"

	"github.com/ferryhq/ferry/internal/route"
)

// TestShardGolden pins the shard of a few ids: a change would send an
// aggregate's new events to another queue while its older ones wait in
// the first, and two consumers would apply it at once.
func TestShardGolden(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		id     string
		shards int
		want   int
	}{
		{"order-1", 16, route.Slice([]byte("order-1")) % 16},
		{"", 16, 5},    // FNV-1a offset basis 2166136261 % 128 = 5
		{"a", 128, 44}, // FNV-1a("a") = 0xe40c292c; % 128 = 0x2c
		{"a", 16, 12},
		{"a", 1, 0},
	} {
		if got := Shard([]byte(c.id), c.shards); got != c.want {
			t.Errorf("Shard(%q, %d) = %d, want %d", c.id, c.shards, got, c.want)
		}
	}
}

// TestShardKeepsSlicesWhole checks that every aggregate of one migration
// slice lands in one shard, for every shard count.
func TestShardKeepsSlicesWhole(t *testing.T) {
	t.Parallel()
	for n := 1; n <= MaxShards; n *= 2 {
		shardOf := map[int]int{}
		for i := range 5000 {
			id := []byte(fmt.Sprintf("agg-%d", i))
			s, sh := route.Slice(id), Shard(id, n)
			if prev, ok := shardOf[s]; ok && prev != sh {
				t.Fatalf("n=%d: slice %d in shards %d and %d", n, s, prev, sh)
			}
			shardOf[s] = sh
		}
	}
}

func TestCheckShards(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 128; n *= 2 {
		if err := CheckShards(n); err != nil {
			t.Errorf("CheckShards(%d) = %v", n, err)
		}
	}
	for _, n := range []int{0, -1, 3, 12, 256, 100} {
		if CheckShards(n) == nil {
			t.Errorf("CheckShards(%d) = nil, want an error", n)
		}
	}
}

func TestRoutingKeyRoundTrip(t *testing.T) {
	t.Parallel()
	for s := range MaxShards {
		k := RoutingKey(s)
		if got, ok := ParseRoutingKey(k); !ok || got != s {
			t.Fatalf("ParseRoutingKey(%q) = %d, %v", k, got, ok)
		}
	}
	for _, k := range []string{"", "1", "0001", "128", "abc", "-01"} {
		if _, ok := ParseRoutingKey(k); ok {
			t.Errorf("ParseRoutingKey(%q) accepted", k)
		}
	}
}
