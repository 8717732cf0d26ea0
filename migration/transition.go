package migration

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/route"
)

// check decides a request: the reason and whether it is accepted. The
// phase machine:
//
//	OLD_ONLY   -> DUAL_WRITE (towards RabbitMQ: every group's shard queues declared there)
//	DUAL_WRITE -> OLD_ONLY (abandon) | CUTOVER k (1 <= k <= 128; every group's shadow gate passed)
//	CUTOVER k  -> CUTOVER k' (k < k' <= 128) | DUAL_WRITE (rollback)
//	CUTOVER 128 -> OLD_RETIRED (a rollback drill recorded; every group drained)
//	OLD_RETIRED: final
func (c *Controller) check(ctx context.Context, tx pgx.Tx, st *State, to Phase, slices int) (string, bool) {
	from := st.Phase
	if _, err := ParsePhase(string(to)); err != nil {
		return err.Error(), false
	}
	if to != Cutover && slices != 0 {
		return fmt.Sprintf("slices apply to %s only; %s takes 0", Cutover, to), false
	}
	switch {
	case from == OldRetired:
		return fmt.Sprintf("forbidden: %s is final; there is no way back from it", OldRetired), false
	case from == OldOnly && to == DualWrite:
		if busy, err := dbsqlc.New().MigrationActiveOther(ctx, tx, st.Plan.Name); err != nil {
			return "cannot read the other plans: " + err.Error(), false
		} else if len(busy) > 0 {
			return fmt.Sprintf("premature: plan %q is in %s; a relay follows one migration at a time", busy[0].Migration, busy[0].Phase), false
		}
		if why := queuesBeforeCopies(ctx, st.Plan, c.Getenv); why != "" {
			return "premature: " + why, false
		}
		return "accepted: the relay writes both channels from this point of the commit order; the old copy is authoritative", true
	case from == DualWrite && to == OldOnly:
		return "accepted (abandon): the relay writes the old channel only from this point of the commit order", true
	case from == DualWrite && to == Cutover:
		if slices < 1 || slices > Slices {
			return fmt.Sprintf("a cutover moves 1 to %d slices, not %d", Slices, slices), false
		}
		if why := c.groups(ctx, st, c.shadowGate); why != "" {
			return "premature: shadow gate not passed: " + why, false
		}
		return fmt.Sprintf("accepted: slices 0-%d (%d of %d) read the new channel as authoritative from this point", slices-1, slices, Slices), true
	case from == Cutover && to == Cutover:
		if slices <= st.Slices || slices > Slices {
			return fmt.Sprintf("a cutover step moves more slices: from %d to at most %d, not %d (rollback is %s)", st.Slices, Slices, slices, DualWrite), false
		}
		return fmt.Sprintf("accepted: slices %d-%d move to the new channel (%d of %d)", st.Slices, slices-1, slices, Slices), true
	case from == Cutover && to == DualWrite:
		return "accepted (rollback): the old copy is authoritative again from this point; the relay still writes both", true
	case from == Cutover && to == OldRetired:
		if st.Slices != Slices {
			return fmt.Sprintf("premature: %d of %d slices moved; retire the old channel after all of them", st.Slices, Slices), false
		}
		drilled, allNew, err := rollbackDrilled(ctx, tx, st.Plan.Name)
		if err != nil {
			return "cannot read the history: " + err.Error(), false
		}
		if !drilled {
			return fmt.Sprintf("premature: no rollback drill recorded (%s -> %s -> %s); rehearse the way back before removing it", Cutover, DualWrite, Cutover), false
		}
		if why := c.groups(ctx, st, c.drained(allNew)); why != "" {
			return "premature: old channel not drained: " + why, false
		}
		return "accepted: the relay writes the new channel only from this point; consumers drain the old one", true
	case from == to:
		return fmt.Sprintf("the plan is in %s already", from), false
	}
	return fmt.Sprintf("forbidden: %s -> %s (%s)", from, to, allowed(from)), false
}

func allowed(from Phase) string {
	switch from {
	case OldOnly:
		return "from OLD_ONLY: DUAL_WRITE"
	case DualWrite:
		return "from DUAL_WRITE: OLD_ONLY (abandon) or CUTOVER"
	case Cutover:
		return "from CUTOVER: more slices, DUAL_WRITE (rollback), or OLD_RETIRED once all slices moved"
	}
	return "none"
}

func (c *Controller) shadowGate(ctx context.Context, plan Plan, group string) error {
	return c.Evidence.ShadowGate(ctx, plan, group)
}

func (c *Controller) drained(epoch int) func(ctx context.Context, plan Plan, group string) error {
	return func(ctx context.Context, plan Plan, group string) error {
		return c.Evidence.Drained(ctx, plan, group, epoch)
	}
}

// groups asks evidence of every group of the plan; "" when all pass.
func (c *Controller) groups(ctx context.Context, st *State, ask func(ctx context.Context, plan Plan, group string) error) string {
	if c.Evidence == nil {
		return "no evidence source configured (Controller.Evidence)"
	}
	for _, g := range st.Plan.Groups {
		if err := ask(ctx, st.Plan, g); err != nil {
			return fmt.Sprintf("group %s: %v", g, err)
		}
	}
	return ""
}

// rollbackDrilled reports whether the plan's accepted steps hold a
// rollback drill (CUTOVER, then DUAL_WRITE, then CUTOVER again), and the
// epoch from which every slice has been on the new channel (0 if one is
// not): the fences the consumers must have passed to be drained.
func rollbackDrilled(ctx context.Context, tx pgx.Tx, plan string) (drilled bool, allNew int, err error) {
	steps, err := dbsqlc.New().MigrationSteps(ctx, tx, plan)
	if err != nil {
		return false, 0, err
	}
	stage := 0 // 1: saw CUTOVER; 2: then DUAL_WRITE; 3: then CUTOVER again
	var h route.History
	for _, s := range steps {
		h = append(h, route.Step{Plan: plan, Epoch: int(s.Epoch), Phase: Phase(s.Phase), Slices: int(s.Slices)})
		switch {
		case stage == 0 && Phase(s.Phase) == Cutover:
			stage = 1
		case stage == 1 && Phase(s.Phase) == DualWrite:
			stage = 2
		case stage == 2 && Phase(s.Phase) == Cutover:
			stage = 3
		}
	}
	for slice := range Slices {
		if h[len(h)-1].Authority(slice) != NewSide {
			return stage == 3, 0, nil
		}
		allNew = max(allNew, h.Since(slice))
	}
	return stage == 3, allNew, nil
}

func pgtypeInt8(v int64) pgtype.Int8 { return pgtype.Int8{Int64: v, Valid: true} }
