package bridge

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/route"
)

// fakeDB is a database New accepts and Run cannot use.
type fakeDB struct{}

func (fakeDB) Begin(context.Context) (pgx.Tx, error) {
	return nil, errors.New("no database in unit tests")
}

// Every wrong setting is refused by New with an error naming its field.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	db := fakeDB{}
	ok := Config{Plan: "move-1", DB: db, Topics: []string{"orders"}}
	cases := []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Plan = "" }, "Config.Plan"},
		{func(c *Config) { c.DB = nil }, "Config.DB"},
		{func(c *Config) { c.Topics = nil }, "Config.Topics"},
		{func(c *Config) { c.Topics = []string{"bad topic"} }, "Config.Topics"},
		{func(c *Config) { c.TopicRegex = "orders[" }, "Config.TopicRegex"},
		{func(c *Config) { c.TopicMap = map[string]string{"stock": "stock.v2"} }, "Config.TopicMap"},
		{func(c *Config) { c.TopicMap = map[string]string{"orders": "no/slash"} }, "Config.TopicMap"},
		{func(c *Config) { c.TopicTemplate = "all-in-one" }, "Config.TopicTemplate"},
		{func(c *Config) { c.TopicTemplate = "b:{topic}" }, "Config.TopicTemplate"},
		{func(c *Config) { c.Group = "two words" }, "Config.Group"},
		{func(c *Config) { c.IDHeader = route.HeaderRoute }, "Config.IDHeader"},
		{func(c *Config) { c.IDFrom = "offset" }, "Config.IDFrom"},
		{func(c *Config) { c.IDFrom, c.IDHeader = IDFromPayload, "msg-id" }, "Config.IDHeader"},
		{func(c *Config) { c.OffsetReset = "none" }, "Config.OffsetReset"},
		{func(c *Config) { c.StepInterval = -time.Second }, "Config.StepInterval"},
		{func(c *Config) { c.CommitInterval = -time.Second }, "Config.CommitInterval"},
		{func(c *Config) { c.MaxInFlightRecords = -1 }, "Config.MaxInFlightRecords"},
		{func(c *Config) { c.ShutdownTimeout = -time.Second }, "Config.ShutdownTimeout"},
	}
	if _, err := New(&ok); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
	for _, tc := range cases {
		c := ok
		tc.change(&c)
		if _, err := New(&c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %s, got %v", tc.want, err)
		}
	}
	// With a regex, a renamed topic must be one it matches.
	c := ok
	c.Topics, c.TopicRegex, c.TopicMap = nil, `legacy\..*`, map[string]string{"legacy.orders": "orders"}
	if _, err := New(&c); err != nil {
		t.Errorf("a rename of a topic the regex matches: %v", err)
	}
}
