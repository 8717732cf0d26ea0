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
		p := &inflight{event: event{row: row{Headers: []header{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte(name), Value: []byte("v")}}}}}
		got, ok := p.reservedHeader(nil)
		if ok != want || (ok && got != name) {
			t.Errorf("reservedHeader with %q = %q, %t; want %t", name, got, ok, want)
		}
	}
	// With the CloudEvents mapping on, the ce_ names it sets are reserved
	// too; other ce_ names are extensions and pass.
	ce := &CloudEvents{Source: "/test"}
	for name, want := range map[string]bool{
		"ce_id": true, "ce_type": true, "ce_source": true, "ce_specversion": true, "ce_time": true, "ce_subject": true,
		"ce_tenant": false, "content-type": false, "id": true,
	} {
		p := &inflight{event: event{row: row{Headers: []header{{Key: []byte(name), Value: []byte("v")}}}}}
		if _, ok := p.reservedHeader(ce); ok != want {
			t.Errorf("reservedHeader(CloudEvents) with %q = %t, want %t", name, ok, want)
		}
		if _, ok := p.reservedHeader(nil); ok && name != "id" {
			t.Errorf("reservedHeader(nil) with %q: reserved without the CloudEvents mapping", name)
		}
	}
	p := &inflight{event: event{row: row{Headers: []header{{Key: []byte("traceparent"), Value: []byte("00-x")}, {Key: []byte("seq"), Value: []byte("1")}}}}}
	if n := testing.AllocsPerRun(100, func() { p.reservedHeader(nil); p.reservedHeader(ce) }); n != 0 {
		t.Errorf("reservedHeader allocates %.0f times per record with ordinary headers, want 0", n)
	}
}
