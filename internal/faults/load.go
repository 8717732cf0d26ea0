package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/outbox"
)

// LoadOptions configure the load generator.
type LoadOptions struct {
	DatabaseURL string
	// Events is how many events to commit, at least.
	Events int
	// Duration spreads them: the generator paces itself at Events/Duration
	// and catches up after an outage.
	Duration time.Duration
	// Aggregates is how many versioned aggregates the events go to.
	Aggregates int
	// Clients is how many transactions run at once.
	Clients int
	// MaxTx is the largest transaction, in events; about one transaction in
	// twenty has between MaxTx/6 and MaxTx events.
	MaxTx int
	// PoisonEvery and HugeEvery add a poison or an oversized event to every
	// n-th transaction of each client (0: never).
	PoisonEvery, HugeEvery int
	// HugeBytes is the payload size of an oversized event.
	HugeBytes int
	// Seed makes the transactions reproducible (but not their timing).
	Seed uint64
	// AbortedFile receives one JSON line per event of a transaction that
	// did not commit, or may not have: {"id": ..., "outcome": ...}.
	AbortedFile string
}

// Outcomes of write transactions that did not (surely) commit, as recorded
// in LoadOptions.AbortedFile.
const (
	OutcomeRolledBack    = "rolled_back"   // rolled back on purpose
	OutcomeFailed        = "failed"        // a statement failed on purpose
	OutcomeFault         = "fault"         // failed before COMMIT because of an injected fault
	OutcomeIndeterminate = "indeterminate" // COMMIT itself failed: the outbox table says
)

// LoadResult counts what the generator did, as the client saw it.
type LoadResult struct {
	TxCommitted      int64   `json:"tx_committed"`
	EventsCommitted  int64   `json:"events_committed"`
	TxRolledBack     int64   `json:"tx_rolled_back"`
	TxFailed         int64   `json:"tx_failed"`
	TxFault          int64   `json:"tx_fault"`
	TxIndeterminate  int64   `json:"tx_indeterminate"`
	EventsNotWritten int64   `json:"events_not_committed"`
	LargestTx        int64   `json:"largest_tx"`
	Seconds          float64 `json:"seconds"`
}

// abortedLine is one line of LoadOptions.AbortedFile.
type abortedLine struct {
	ID      uuid.UUID `json:"id"`
	Outcome string    `json:"outcome"`
}

func (o *LoadOptions) validate() error {
	switch {
	case o.DatabaseURL == "":
		return errors.New("load: database URL is required")
	case o.Events <= 0:
		return errors.New("load: events must be positive")
	case o.Aggregates < 1 || o.Aggregates > 10000:
		return errors.New("load: aggregates must be between 1 and 10000")
	case o.Clients < 1:
		return errors.New("load: clients must be positive")
	case o.MaxTx < 1:
		return errors.New("load: max-tx must be positive")
	case o.AbortedFile == "":
		return errors.New("load: aborted file is required")
	}
	return nil
}

// generator is the state the clients share.
type generator struct {
	o       LoadOptions
	pool    *pgxpool.Pool
	start   time.Time
	res     LoadResult
	written atomic.Int64 // events committed, for pacing and stopping

	mu      sync.Mutex
	aborted *bufio.Writer
}

// RunLoad writes events until LoadOptions.Events have committed or ctx ends.
func RunLoad(ctx context.Context, o LoadOptions) (*LoadResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("load: database URL: %w", err)
	}
	cfg.MaxConns = int32(o.Clients + 1)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	defer pool.Close()
	f, err := os.OpenFile(o.AbortedFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	defer f.Close()
	g := &generator{o: o, pool: pool, start: time.Now(), aborted: bufio.NewWriter(f)}
	var wg sync.WaitGroup
	for c := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.client(ctx, c)
		}()
	}
	wg.Wait()
	g.mu.Lock()
	err = g.aborted.Flush()
	g.mu.Unlock()
	g.res.EventsCommitted = g.written.Load()
	g.res.Seconds = time.Since(g.start).Seconds()
	return &g.res, err
}

// pace waits until the schedule allows more events; false when done.
func (g *generator) pace(ctx context.Context) bool {
	rate := float64(g.o.Events) / max(g.o.Duration.Seconds(), 0.001)
	for {
		n := g.written.Load()
		if n >= int64(g.o.Events) || ctx.Err() != nil {
			return false
		}
		if float64(n) < rate*time.Since(g.start).Seconds()+rate/10 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// plan is one write transaction before it runs.
type plan struct {
	events  []outbox.Event
	aggs    []string // versioned aggregates touched, sorted, distinct
	outcome string   // "" to commit, OutcomeRolledBack or OutcomeFailed
}

func (g *generator) newPlan(rng *rand.Rand, client, n int) plan {
	size := 1
	switch r := rng.Float64(); {
	case r < 0.05 && g.o.MaxTx >= 6:
		size = g.o.MaxTx/6 + rng.IntN(g.o.MaxTx-g.o.MaxTx/6+1)
	case r < 0.30:
		size = 2 + rng.IntN(min(19, max(g.o.MaxTx-1, 1)))
	}
	size = min(size, g.o.MaxTx)
	var p plan
	seen := map[string]bool{}
	for range size {
		a := aggregateName(rng.IntN(g.o.Aggregates))
		p.events = append(p.events, outbox.Event{AggregateType: AggregateType, AggregateID: a, EventType: "Changed"})
		if !seen[a] {
			seen[a] = true
			p.aggs = append(p.aggs, a)
		}
	}
	slices.Sort(p.aggs)
	if g.o.PoisonEvery > 0 && n%g.o.PoisonEvery == g.o.PoisonEvery-1 {
		a := fmt.Sprintf("poison-%d-%d", client, n)
		p.events = append(p.events, outbox.Event{AggregateType: AggregateType, AggregateID: a, EventType: "Poison",
			Payload: encodeBody(eventBody{Kind: KindPoison, Aggregate: a}, nil)})
	}
	if g.o.HugeEvery > 0 && n%g.o.HugeEvery == g.o.HugeEvery/2 {
		a := fmt.Sprintf("huge-%d-%d", client, n)
		pad := make([]byte, g.o.HugeBytes)
		for i := range pad {
			pad[i] = byte(rng.Uint32())
		}
		p.events = append(p.events, outbox.Event{AggregateType: AggregateType, AggregateID: a, EventType: "Huge",
			Payload: encodeBody(eventBody{Kind: KindHuge, Aggregate: a}, pad)})
	}
	switch r := rng.Float64(); {
	case r < 0.04:
		p.outcome = OutcomeRolledBack
	case r < 0.07:
		p.outcome = OutcomeFailed
	}
	for i := range p.events {
		p.events[i].ID = uuid.Must(uuid.NewV7())
	}
	return p
}

func (g *generator) client(ctx context.Context, c int) {
	rng := rand.New(rand.NewPCG(g.o.Seed, uint64(c)))
	for n := 0; g.pace(ctx); n++ {
		p := g.newPlan(rng, c, n)
		outcome, err := g.write(ctx, p)
		g.record(p, outcome)
		if err != nil && ctx.Err() == nil {
			// PostgreSQL is restarting, most likely: back off a little.
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// write runs one planned transaction and says how it ended: "" committed.
func (g *generator) write(ctx context.Context, p plan) (string, error) {
	tx, err := g.pool.Begin(ctx)
	if err != nil {
		return OutcomeFault, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	// Lock the versions in a fixed order: concurrent writers never deadlock,
	// and an aggregate's versions commit in version order.
	rows, err := tx.Query(ctx, `SELECT aggregate_id, version FROM fault_versions
		WHERE aggregate_id = ANY($1) ORDER BY aggregate_id FOR UPDATE`, p.aggs)
	if err != nil {
		return OutcomeFault, err
	}
	versions := map[string]int64{}
	for rows.Next() {
		var a string
		var v int64
		if err := rows.Scan(&a, &v); err != nil {
			rows.Close()
			return OutcomeFault, err
		}
		versions[a] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return OutcomeFault, err
	}
	for i, e := range p.events {
		if e.Payload != nil {
			continue // poison or huge: not versioned
		}
		v := versions[e.AggregateID] + 1
		versions[e.AggregateID] = v
		p.events[i].Payload = encodeBody(eventBody{Kind: KindVersioned, Aggregate: e.AggregateID, Version: v}, nil)
		p.events[i].Headers = map[string]string{HeaderVersion: strconv.FormatInt(v, 10)}
	}
	aggs, vs := make([]string, 0, len(versions)), make([]int64, 0, len(versions))
	for a, v := range versions {
		aggs, vs = append(aggs, a), append(vs, v)
	}
	if _, err := tx.Exec(ctx, `UPDATE fault_versions f SET version = u.version
		FROM unnest($1::text[], $2::bigint[]) u(aggregate_id, version) WHERE f.aggregate_id = u.aggregate_id`, aggs, vs); err != nil {
		return OutcomeFault, err
	}
	if _, err := outbox.Write(ctx, tx, p.events...); err != nil {
		return OutcomeFault, err
	}
	switch p.outcome {
	case OutcomeRolledBack:
		if err := tx.Rollback(ctx); err != nil {
			return OutcomeFault, err
		}
		return OutcomeRolledBack, nil
	case OutcomeFailed:
		// A statement that fails after the events were written: the whole
		// transaction must go, events included.
		var x int
		if err := tx.QueryRow(ctx, `SELECT 1 / (SELECT count(*) FROM fault_versions WHERE false)`).Scan(&x); err == nil {
			return "", errors.New("load: division by zero succeeded")
		}
		if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
			return OutcomeIndeterminate, fmt.Errorf("commit of a failed transaction: %v", err)
		}
		return OutcomeFailed, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return OutcomeIndeterminate, err
	}
	return "", nil
}

// record counts a transaction and remembers the ids of one that did not
// surely commit.
func (g *generator) record(p plan, outcome string) {
	if outcome == "" {
		g.written.Add(int64(len(p.events)))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch outcome {
	case "":
		g.res.TxCommitted++
		g.res.LargestTx = max(g.res.LargestTx, int64(len(p.events)))
		return
	case OutcomeRolledBack:
		g.res.TxRolledBack++
	case OutcomeFailed:
		g.res.TxFailed++
	case OutcomeFault:
		g.res.TxFault++
	case OutcomeIndeterminate:
		g.res.TxIndeterminate++
	}
	g.res.EventsNotWritten += int64(len(p.events))
	enc := json.NewEncoder(g.aborted)
	for _, e := range p.events {
		_ = enc.Encode(abortedLine{ID: e.ID, Outcome: outcome})
	}
}
