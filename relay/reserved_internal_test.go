package relay

import "testing"

// The check every record passes finds Ferry's names and costs no
// allocation for the names it lets through (the conversion to string is
// inlined away today; this keeps it so).
func TestReservedHeaderCheck(t *testing.T) {
	for name, want := range map[string]bool{
		"id": true, "event_type": true, "aggregate_type": true, "aggregate_id": true, "ferry.dlq.reason": true, "ferry.": true,
		"traceparent": false, "ferry": false, "Event_Type": false, "seq": false, "idx": false,
	} {
		p := &inflight{row: row{Headers: []header{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte(name), Value: []byte("v")}}}}
		got, ok := p.reservedHeader()
		if ok != want || (ok && got != name) {
			t.Errorf("reservedHeader with %q = %q, %t; want %t", name, got, ok, want)
		}
	}
	p := &inflight{row: row{Headers: []header{{Key: []byte("traceparent"), Value: []byte("00-x")}, {Key: []byte("seq"), Value: []byte("1")}}}}
	if n := testing.AllocsPerRun(100, func() { p.reservedHeader() }); n != 0 {
		t.Errorf("reservedHeader allocates %.0f times per record with ordinary headers, want 0", n)
	}
}
