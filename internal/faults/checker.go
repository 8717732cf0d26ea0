package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
)

// ConsumerFigures are the checker's findings for one consumer.
type ConsumerFigures struct {
	Consumer string
	// Effects is the number of effect rows; Applied the events with at
	// least one.
	Effects, Applied int64
	// DeadLettered and Quarantined are events without an effect that the
	// dead-letter topic (for this consumer) or the quarantine table
	// account for, with a reason.
	DeadLettered, Quarantined int64
	// MigrationQuarantined are events without an effect that the
	// consumer's live-migration quarantine holds (their authoritative copy
	// never applied; M3): accounted, and to replay.
	MigrationQuarantined int64
	// Lost are committed events without an effect that nothing accounts
	// for. M1 and M3 want 0.
	Lost int64
	// DoubleEffects are effect rows beyond the first of an event. M1 wants 0.
	DoubleEffects int64
	// Inversions are effects applied on a state at or beyond their own
	// version; Gaps are effects applied on a state more than one version
	// behind (an earlier version never applied). Order wants 0 of each.
	Inversions, Gaps int64
	// StateMismatches are aggregates whose final state is not the latest
	// version the producer committed. M2 wants 0.
	StateMismatches int64
	// UnknownEffects are effects of ids the outbox does not hold: events of
	// transactions that never committed, or invented ones. Want 0.
	UnknownEffects int64
	// Missing lists up to 10 lost ids, for the report.
	Missing []string
	// LossyOrder counts the out-of-order effects and final-state
	// mismatches of aggregates a lossy channel dropped an event of (a
	// migration's negative control): the loss breaks their order, so they
	// are not counted in Inversions, Gaps and StateMismatches.
	LossyOrder int64

	lost []uuid.UUID // every lost id
}

// CommittedFigures count the events the outbox table holds for the run:
// the truth about what committed, whatever the load generator saw.
type CommittedFigures struct {
	Events, Versioned, Poison, Huge, Transactions int64
	// Aggregates is how many aggregates the versioned events touch.
	Aggregates int64
	// LatestVersions is the sum of the aggregates' latest versions (equal to
	// Versioned when versions have no gaps).
	LatestVersions int64
	// Foreign is how many of Versioned a producer that is not Ferry's
	// published (fault_foreign), not in the outbox.
	Foreign int64
}

// AbortedFigures check the events of write transactions that failed.
type AbortedFigures struct {
	// Events of transactions rolled back or failed, on purpose or by a
	// fault, that must not exist.
	Events int64
	// Committed of them are in the outbox anyway. Want 0.
	Committed int64
	// WithEffect of them have an effect. Want 0.
	WithEffect int64
	// Indeterminate are events whose COMMIT failed, so the client cannot
	// know; IndeterminateCommitted of them are in the outbox (and are then
	// held to M1 like any committed event).
	Indeterminate, IndeterminateCommitted int64
}

// check computes the report's findings from the database and the topics.
func (p *pipeline) check(ctx context.Context, rep *Report) error {
	db := p.pool
	// Committed events, by kind.
	c := &rep.Committed
	if err := db.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE headers ? $1),
			count(*) FILTER (WHERE event_type = 'Poison'),
			count(*) FILTER (WHERE event_type = 'Huge'),
			count(DISTINCT xmin::text),
			count(DISTINCT aggregate_id) FILTER (WHERE headers ? $1)
		FROM outbox WHERE aggregate_type = $2`, HeaderVersion, AggregateType).
		Scan(&c.Events, &c.Versioned, &c.Poison, &c.Huge, &c.Transactions, &c.Aggregates); err != nil {
		return fmt.Errorf("count committed events: %w", err)
	}
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(version), 0) FROM fault_versions`).Scan(&c.LatestVersions); err != nil {
		return err
	}
	// A foreign producer's events are versioned events too.
	if err := db.QueryRow(ctx, `SELECT count(*) FROM fault_foreign`).Scan(&c.Foreign); err != nil {
		return err
	}
	c.Versioned += c.Foreign
	if _, err := db.Exec(ctx, `CREATE INDEX IF NOT EXISTS fault_effects_id ON fault_effects (consumer, message_id)`); err != nil {
		return err
	}

	// What accounts for an event without an effect.
	quarantined := map[uuid.UUID]string{}
	rows, err := db.Query(ctx, `SELECT id, reason FROM outbox_quarantine WHERE reason <> ''`)
	if err != nil {
		return fmt.Errorf("read quarantine: %w", err)
	}
	for rows.Next() {
		var id uuid.UUID
		var reason string
		if err := rows.Scan(&id, &reason); err != nil {
			return err
		}
		quarantined[id] = reason
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rep.QuarantineReasons = countReasons(quarantined)

	for _, consumer := range p.consumers {
		f := ConsumerFigures{Consumer: consumer}
		dlq, err := p.deadLetters(ctx, consumer)
		if err != nil {
			return err
		}
		for _, reason := range dlq {
			rep.DeadLetterReasons = addReason(rep.DeadLetterReasons, reason)
		}
		migQ := map[uuid.UUID]bool{}
		qrows, err := db.Query(ctx, `SELECT message_id FROM ferry_inbox_quarantine WHERE consumer = $1`, consumer)
		if err != nil {
			return fmt.Errorf("read the migration quarantine: %w", err)
		}
		qids, err := pgx.CollectRows(qrows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read the migration quarantine: %w", err)
		}
		for _, s := range qids {
			if id, err := uuid.Parse(s); err == nil {
				migQ[id] = true
			}
		}
		// The order of an aggregate a lossy channel dropped an event of is
		// broken by the loss itself (its next version applies after a gap,
		// the replayed one last): counted apart.
		lossy := append([]string{}, p.lossyAggregates...)
		var lossyOrder, lossyState int64
		if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id),
				count(*) FILTER (WHERE version <= prev_version AND aggregate_id <> ALL($2)),
				count(*) FILTER (WHERE version > prev_version + 1 AND aggregate_id <> ALL($2)),
				count(*) FILTER (WHERE (version <= prev_version OR version > prev_version + 1) AND aggregate_id = ANY($2))
			FROM fault_effects WHERE consumer = $1`, consumer, lossy).
			Scan(&f.Effects, &f.Applied, &f.Inversions, &f.Gaps, &lossyOrder); err != nil {
			return fmt.Errorf("count effects: %w", err)
		}
		f.DoubleEffects = f.Effects - f.Applied
		if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE aggregate_id <> ALL($2)), count(*) FILTER (WHERE aggregate_id = ANY($2))
			FROM fault_versions v JOIN fault_state s USING (aggregate_id)
			WHERE s.consumer = $1 AND s.version <> v.version`, consumer, lossy).Scan(&f.StateMismatches, &lossyState); err != nil {
			return fmt.Errorf("compare states: %w", err)
		}
		f.LossyOrder = lossyOrder + lossyState
		if err := db.QueryRow(ctx, `SELECT count(*) FROM fault_effects e
			WHERE e.consumer = $1 AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = e.message_id)
			AND NOT EXISTS (SELECT 1 FROM fault_foreign f WHERE f.id = e.message_id)`, consumer).Scan(&f.UnknownEffects); err != nil {
			return fmt.Errorf("find unknown effects: %w", err)
		}
		missing, err := db.Query(ctx, `SELECT o.id FROM (SELECT id FROM outbox WHERE aggregate_type = $2
				UNION ALL SELECT id FROM fault_foreign) o
			WHERE NOT EXISTS (SELECT 1 FROM fault_effects e WHERE e.consumer = $1 AND e.message_id = o.id)
			ORDER BY o.id`, consumer, AggregateType)
		if err != nil {
			return fmt.Errorf("find events without effect: %w", err)
		}
		ids, err := pgx.CollectRows(missing, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("find events without effect: %w", err)
		}
		for _, id := range ids {
			switch {
			case quarantined[id] != "":
				f.Quarantined++
			case dlq[id] != "":
				f.DeadLettered++
			case migQ[id]:
				f.MigrationQuarantined++
			default:
				f.Lost++
				f.lost = append(f.lost, id)
				if len(f.Missing) < 10 {
					f.Missing = append(f.Missing, id.String())
				}
			}
		}
		rep.Consumers = append(rep.Consumers, f)
	}
	return p.checkAborted(ctx, rep)
}

// deadLetters reads the dead-letter topic and returns, for consumer, the
// reason of every message id it dead-lettered.
func (p *pipeline) deadLetters(ctx context.Context, consumer string) (map[uuid.UUID]string, error) {
	var dls []inbox.DeadLetter
	var err error
	if p.o.rabbit() {
		dls, err = p.rabbitDeadLetters(ctx, consumer, p.dlq)
	} else {
		dls, err = inbox.ListDeadLetters(ctx, []kgo.Opt{kgo.SeedBrokers(p.stack.Brokers...)}, p.dlq,
			&inbox.DeadLetterFilter{Consumer: consumer})
		if err != nil {
			err = fmt.Errorf("read dead letters of %s: %w", consumer, err)
		}
	}
	if err != nil {
		return nil, err
	}
	if p.newTopic != "" { // a migration's consumers dead-letter on the new channel too
		var onNew []inbox.DeadLetter
		if p.o.MigrateTo == BrokerRabbitMQ {
			onNew, err = p.rabbitDeadLetters(ctx, consumer, p.newDL)
		} else if onNew, err = inbox.ListDeadLetters(ctx, []kgo.Opt{kgo.SeedBrokers(p.stack.BrokersB...)}, p.newDL,
			&inbox.DeadLetterFilter{Consumer: consumer}); err != nil {
			err = fmt.Errorf("read dead letters of %s on cluster B: %w", consumer, err)
		}
		if err != nil {
			return nil, err
		}
		dls = append(dls, onNew...)
	}
	out := map[uuid.UUID]string{}
	for _, d := range dls {
		id, err := uuid.Parse(d.ID)
		if err != nil || d.Reason == "" {
			continue // not accountable: the event stays lost
		}
		out[id] = string(d.Reason)
	}
	return out, nil
}

// checkAborted reads the load generator's record of transactions that did
// not commit and checks that none of their events exists or took effect.
func (p *pipeline) checkAborted(ctx context.Context, rep *Report) error {
	f, err := os.Open(p.abortedFile())
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var sure, unsure []uuid.UUID
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l abortedLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("%s: %w", p.abortedFile(), err)
		}
		if l.Outcome == OutcomeIndeterminate {
			unsure = append(unsure, l.ID)
		} else {
			sure = append(sure, l.ID)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	a := &rep.Aborted
	a.Events, a.Indeterminate = int64(len(sure)), int64(len(unsure))
	if err := p.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM outbox WHERE id = ANY($1)),
			(SELECT count(DISTINCT message_id) FROM fault_effects WHERE message_id = ANY($1)),
			(SELECT count(*) FROM outbox WHERE id = ANY($2))`, sure, unsure).
		Scan(&a.Committed, &a.WithEffect, &a.IndeterminateCommitted); err != nil {
		return fmt.Errorf("check aborted events: %w", err)
	}
	return nil
}

func countReasons(m map[uuid.UUID]string) map[string]int64 {
	out := map[string]int64{}
	for _, r := range m {
		out[r]++
	}
	return out
}

func addReason(m map[string]int64, reason string) map[string]int64 {
	if m == nil {
		m = map[string]int64{}
	}
	m[reason]++
	return m
}
