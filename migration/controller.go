package migration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
	"github.com/ferryhq/ferry/outbox"
)

// Evidence is what the consumer groups report through the channels, which
// the controller needs before two changes: the shadow gate before CUTOVER
// (events checked, none missing beyond the allowed lateness, no payload
// mismatch, p99 lateness within bound) and the drain before OLD_RETIRED
// (the old channel drained, the group's migration quarantine empty). Each
// method returns nil when the group passes, or why it does not.
type Evidence interface {
	ShadowGate(ctx context.Context, plan Plan, group string) error
	// Drained: the group applied every record the old channel was
	// authoritative for, which it shows by passing the old channel's
	// fences of epoch (from which every slice is on the new channel) or
	// later on every partition.
	Drained(ctx context.Context, plan Plan, group string, epoch int) error
}

// ErrNotFound means no plan has the name.
var ErrNotFound = errors.New("migration: no such plan")

// Controller changes plans' phases in PostgreSQL.
type Controller struct {
	DB       outbox.Beginner
	Evidence Evidence
	// Getenv reads the variables a plan's channels name for their
	// passwords, where the controller reaches a channel itself (the
	// queues DUAL_WRITE towards RabbitMQ needs). Defaults to os.Getenv.
	Getenv func(string) string
}

// State is where a plan stands: its phase, the slices moved (CUTOVER), and
// the epoch of the step that put it there (0: created).
type State struct {
	Plan   Plan
	Phase  Phase
	Slices int
	Epoch  int
	Since  time.Time
}

// Moved is how many slices are on the new channel: Slices in CUTOVER,
// all of them in OLD_RETIRED, none otherwise.
func (s State) Moved() int {
	switch s.Phase {
	case Cutover:
		return s.Slices
	case OldRetired:
		return Slices
	}
	return 0
}

// Decision is one recorded request.
type Decision struct {
	ID         int64
	At         time.Time
	By         string
	From       Phase
	FromSlices int
	To         Phase
	ToSlices   int
	Accepted   bool
	Reason     string // why it was rejected, or what it did
	Epoch      int    // the new epoch when accepted
}

// Create records a plan in OLD_ONLY (epoch 0). by names who asked.
func (c *Controller) Create(ctx context.Context, p Plan, by string) error {
	if err := p.validate(); err != nil {
		return err
	}
	if by == "" {
		return errors.New("migration: Create needs who asks (by)")
	}
	oldJSON, _ := json.Marshal(p.Old) // a struct of strings always marshals
	newJSON, _ := json.Marshal(p.New)
	q := dbsqlc.New()
	err := pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		if err := q.MigrationSerialize(ctx, tx); err != nil { // its step 0 too
			return err
		}
		if err := q.MigrationCreate(ctx, tx, dbsqlc.MigrationCreateParams{
			Name: p.Name, OldChannel: oldJSON, NewChannel: newJSON, Groups: p.Groups, CreatedBy: by}); err != nil {
			return err
		}
		return q.MigrationStepInsert(ctx, tx, dbsqlc.MigrationStepInsertParams{Migration: p.Name, Epoch: 0, Phase: string(OldOnly), Slices: 0})
	})
	if pgerr.Is(err, pgerrcode.UniqueViolation) {
		return fmt.Errorf("migration: a plan named %q exists already", p.Name)
	}
	if err != nil {
		return fmt.Errorf("migration: create plan %q: %w", p.Name, err)
	}
	return nil
}

// State reads where the plan stands.
func (c *Controller) State(ctx context.Context, name string) (*State, error) {
	var st *State
	err := pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		var err error
		st, err = readState(ctx, tx, name)
		return err
	})
	return st, err
}

func readState(ctx context.Context, tx pgx.Tx, name string) (*State, error) {
	p, err := loadPlan(ctx, tx, name)
	if err != nil {
		return nil, err
	}
	step, err := dbsqlc.New().MigrationStepCurrent(ctx, tx, name)
	if err != nil {
		return nil, fmt.Errorf("migration: read the phase of %q: %w", name, err)
	}
	return &State{Plan: p, Phase: Phase(step.Phase), Slices: int(step.Slices), Epoch: int(step.Epoch), Since: step.CreatedAt}, nil
}

// loadPlan reads plan name: its channels and groups (ErrNotFound when
// there is none).
func loadPlan(ctx context.Context, db outbox.DBTX, name string) (Plan, error) {
	m, err := dbsqlc.New().MigrationGet(ctx, db, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Plan{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return Plan{}, fmt.Errorf("migration: read plan %q: %w", name, err)
	}
	p := Plan{Name: m.Name, Groups: m.Groups}
	if err := json.Unmarshal(m.OldChannel, &p.Old); err != nil {
		return Plan{}, fmt.Errorf("migration: plan %q: old channel: %w", name, err)
	}
	if err := json.Unmarshal(m.NewChannel, &p.New); err != nil {
		return Plan{}, fmt.Errorf("migration: plan %q: new channel: %w", name, err)
	}
	return p, nil
}

// Request asks to move the plan to phase to (with slices moved, for
// CUTOVER; 0 otherwise), on behalf of by. The request is recorded whatever
// the answer: an accepted one also records the new step, which the relay
// applies at its point of the commit order; a forbidden or premature one
// changes nothing and Decision.Reason says why. The error is for failures
// to decide (the database), never for a rejection.
func (c *Controller) Request(ctx context.Context, name string, to Phase, slices int, by string) (*Decision, error) {
	if by == "" {
		return nil, errors.New("migration: a request needs who asks (by)")
	}
	q := dbsqlc.New()
	var d *Decision
	err := pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		// First, before the transaction writes: a relay creating its slot
		// holds the same lock, so no step commits while it does.
		if err := q.MigrationSerialize(ctx, tx); err != nil {
			return err
		}
		if _, err := q.MigrationLock(ctx, tx, name); errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		} else if err != nil {
			return err
		}
		st, err := readState(ctx, tx, name)
		if err != nil {
			return err
		}
		reason, accepted := c.check(ctx, tx, st, to, slices)
		row, err := q.MigrationRequestInsert(ctx, tx, dbsqlc.MigrationRequestInsertParams{
			Migration: name, RequestedBy: by, FromPhase: string(st.Phase), FromSlices: int32(st.Slices),
			ToPhase: string(to), ToSlices: int32(slices), Accepted: accepted, Reason: reason})
		if err != nil {
			return err
		}
		d = &Decision{ID: row.ID, At: row.RequestedAt, By: by, From: st.Phase, FromSlices: st.Slices, To: to, ToSlices: slices,
			Accepted: accepted, Reason: reason, Epoch: st.Epoch}
		if !accepted {
			return nil
		}
		d.Epoch = st.Epoch + 1
		return q.MigrationStepInsert(ctx, tx, dbsqlc.MigrationStepInsertParams{
			Migration: name, Epoch: int32(d.Epoch), Phase: string(to), Slices: int32(slices),
			RequestID: pgtypeInt8(row.ID)})
	})
	if err != nil {
		return nil, fmt.Errorf("migration: request %s of %q: %w", to, name, err)
	}
	return d, nil
}

// History returns every request of the plan, oldest first.
func (c *Controller) History(ctx context.Context, name string) ([]Decision, error) {
	var out []Decision
	err := pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		rows, err := dbsqlc.New().MigrationRequests(ctx, tx, name)
		if err != nil {
			return err
		}
		for _, r := range rows {
			out = append(out, Decision{ID: r.ID, At: r.RequestedAt, By: r.RequestedBy,
				From: Phase(r.FromPhase), FromSlices: int(r.FromSlices), To: Phase(r.ToPhase), ToSlices: int(r.ToSlices),
				Accepted: r.Accepted, Reason: r.Reason})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migration: history of %q: %w", name, err)
	}
	return out, nil
}
