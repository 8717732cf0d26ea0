package demo

import (
	"strings"
	"testing"
)

func TestParseSeriesReadsOneMetricWithItsLabels(t *testing.T) {
	t.Parallel()
	page := `# HELP ferry_worker_migration_copies_total Stamped copies.
# TYPE ferry_worker_migration_copies_total counter
ferry_worker_migration_copies_total{consumer="stock.reservation",role="authoritative",side="old"} 12
ferry_worker_migration_copies_total{consumer="stock.reservation",role="shadow",side="new"} 3
ferry_worker_migration_copies_total{consumer="order.status",role="authoritative",side="old"} 5
ferry_worker_migration_copies_total_created{consumer="order.status",role="authoritative",side="old"} 1.7e+09
ferry_worker_migration_copies_totalx 99
ferry_worker_odd_total{consumer="a \"quoted\", b",side="old"} 2
`
	ms, err := parseSeries(strings.NewReader(page), "ferry_worker_migration_copies_total")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 {
		t.Fatalf("%d series, want 3 (another metric sharing the prefix is not one): %+v", len(ms), ms)
	}
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{nil, 20},
		{[]string{"side", "old"}, 17},
		{[]string{"consumer", "stock.reservation", "side", "old", "role", "authoritative"}, 12},
		{[]string{"consumer", "stock.reservation", "role", "shadow"}, 3},
		{[]string{"consumer", "nobody"}, 0},
	} {
		if got := ms.sum(c.labels...); got != c.want {
			t.Errorf("sum(%q) = %v, want %v", c.labels, got, c.want)
		}
	}

	odd, err := parseSeries(strings.NewReader(page), "ferry_worker_odd_total")
	if err != nil {
		t.Fatal(err)
	}
	if len(odd) != 1 || odd[0].labels["consumer"] != `a "quoted", b` || odd[0].labels["side"] != "old" || odd[0].value != 2 {
		t.Fatalf("escaped label value: %+v", odd)
	}
}
