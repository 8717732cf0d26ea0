package relay

import (
	"errors"
	"fmt"
	"mime"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/twmb/franz-go/pkg/kgo"
)

// CloudEvents makes every record also a CloudEvent in the binary mode of the
// CloudEvents Kafka protocol binding (specversion 1.0), so that consumers
// that know CloudEvents and not Ferry can read it. Ferry's own headers stay.
// Each record gets:
//
//	ce_specversion  1.0
//	ce_id           the outbox id (the same as Ferry's id header)
//	ce_type         the event type
//	ce_source       Source
//	ce_subject      the aggregate id
//	ce_time         the row's created_at, RFC 3339 in UTC
//	content-type    the row's own content-type header, else ContentType
//
// A row whose own headers use one of the ce_ names above is quarantined
// (ReasonReservedHeader): published, the record would carry two values. Its
// other ce_ headers pass through as CloudEvents extensions.
type CloudEvents struct {
	// Source is ce_source: a URI reference naming the context in which the
	// events happen, e.g. "/orders" or "urn:example:orders". Required.
	Source string

	// ContentType is the content-type of the records whose row has none
	// (datacontenttype), e.g. "application/json". Defaults to empty: no
	// content-type header, which CloudEvents allows.
	ContentType string
}

// The CloudEvents Kafka binding's header names and the one spec version.
const (
	ceSpecVersion     = "ce_specversion"
	ceID              = "ce_id"
	ceType            = "ce_type"
	ceSource          = "ce_source"
	ceSubject         = "ce_subject"
	ceTime            = "ce_time"
	ceContentType     = "content-type"
	ceSpecVersionWire = "1.0"
)

// ceHeaders are the ce_ names the relay sets.
var ceHeaders = []string{ceSpecVersion, ceID, ceType, ceSource, ceSubject, ceTime}

func (c *CloudEvents) validate() error {
	if c == nil {
		return nil
	}
	if c.Source == "" {
		return errors.New("relay: Config.CloudEvents.Source is required: a URI reference such as /orders or urn:example:orders")
	}
	if strings.IndexFunc(c.Source, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return fmt.Errorf("relay: Config.CloudEvents.Source %q: a URI reference holds no spaces or control characters", c.Source)
	}
	if _, err := url.Parse(c.Source); err != nil {
		return fmt.Errorf("relay: Config.CloudEvents.Source %q is not a URI reference: %w", c.Source, err)
	}
	if c.ContentType != "" {
		if _, _, err := mime.ParseMediaType(c.ContentType); err != nil {
			return fmt.Errorf("relay: Config.CloudEvents.ContentType %q is not a media type: %w", c.ContentType, err)
		}
	}
	return nil
}

// addHeaders appends the CloudEvents headers of p's row to hs.
func (c *CloudEvents) addHeaders(hs []kgo.RecordHeader, p *inflight) []kgo.RecordHeader {
	r := &p.row
	hs = append(hs,
		kgo.RecordHeader{Key: ceSpecVersion, Value: []byte(ceSpecVersionWire)},
		kgo.RecordHeader{Key: ceID, Value: p.id[:]},
		kgo.RecordHeader{Key: ceType, Value: r.EventType},
		kgo.RecordHeader{Key: ceSource, Value: []byte(c.Source)},
		kgo.RecordHeader{Key: ceSubject, Value: r.AggregateID},
		kgo.RecordHeader{Key: ceTime, Value: r.CreatedAt.UTC().AppendFormat(nil, time.RFC3339Nano)},
	)
	if c.ContentType != "" && !slices.ContainsFunc(r.Headers, func(h header) bool { return strings.EqualFold(string(h.Key), ceContentType) }) {
		hs = append(hs, kgo.RecordHeader{Key: ceContentType, Value: []byte(c.ContentType)})
	}
	return hs
}

// reservedCloudEventsHeader reports whether a row's own header would clash
// with one the mapping sets.
func reservedCloudEventsHeader(name string) bool {
	return slices.Contains(ceHeaders, name)
}
