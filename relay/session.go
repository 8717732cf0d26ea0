package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/pgerr"
	"github.com/ferryhq/ferry/internal/replsock"
	"github.com/ferryhq/ferry/migration"
)

// promptReport is how soon a moved confirmed position is reported: it
// bounds what a crash publishes twice to the records in flight plus this
// much throughput.
const promptReport = 10 * time.Millisecond

// deadlineSlack is how early the stream's read deadline may fall against
// the one the loop asks for (see replsock.Conn.ReadDeadlineBy): a read ends
// that much sooner at most, and the loop goes round once more.
const deadlineSlack = time.Millisecond

// errSlotBusy means another process streams from the slot: this relay is a
// standby.
var errSlotBusy = errors.New("replication slot is active")

// errServerSilent means the replication connection stayed silent for
// Config.ServerTimeout: the session is abandoned and a new one connects.
var errServerSilent = errors.New("replication connection silent")

// session is one replication connection's life: from START_REPLICATION to an
// error or a clean stop. A failed session is thrown away whole: the next one
// resumes from the slot's confirmed position and publishes again whatever
// was in flight, so order per partition is kept and nothing is lost.
type session struct {
	r       *Relay
	cfg     *Config
	log     *slog.Logger
	conn    *pgconn.PgConn
	pool    *pgxpool.Pool
	sink    Sink
	own     *channelOut // the relay's own channel (a migration's old one)
	tracker *lsnTracker
	quar    *quarantiner
	gate    *topicGate     // own's
	hold    *aggregateHold // Config.QuarantineOrder keep; nil otherwise
	record  *slotRecorder
	rels    *relations
	// sctx is the context of produced records. It outlives a shutdown
	// request so that in-flight records can still be acknowledged.
	sctx context.Context

	failOnce sync.Once
	failed   chan struct{}
	failErr  error
	promise  func(*kgo.Record, error) // s.acknowledged, bound once
	// inflights are this session's, for reuse (their Context is sctx)
	inflights *inflights

	received     pglogrepl.LSN // end of the newest WAL data received
	lastReported pglogrepl.LSN
	lastReport   time.Time
	open         *txn          // transaction being decoded, nil between transactions
	openLSN      pglogrepl.LSN // its commit LSN, from Begin
	openCommit   time.Time     // its commit time, from Begin
	seq          uint64        // the last record's publication order
	heard        time.Time     // when the message being handled arrived

	// A live migration (route.go): the newest step applied, the plan in
	// effect (nil: none, or OLD_ONLY), and a step waiting to apply.
	routeSeq int64
	route    *router
	step     *pendingStep
	stopping <-chan struct{} // the stream's context ends: a stop was asked

	// pending is work the stream waits for off the loop (pendingCall); nil
	// when there is none.
	pending *pendingCall
}

func (r *Relay) session(ctx context.Context, pool *pgxpool.Pool, sink Sink, log *slog.Logger) error {
	if err := prepare(ctx, pool, r.cfg.Slot, r.cfg.Publication, r.cfg.NoCreate, r.cfg.Logger); err != nil {
		return err
	}
	// The slot as it is before this session holds it: only pruneSteps
	// reads it, for the restart_lsn it reads while no process holds the
	// slot. Where the stream starts is read once the session holds it.
	st, err := readSlot(ctx, pool, r.cfg.Slot)
	if err != nil {
		return err
	}
	pruneSteps(ctx, pool, r.cfg.Slot, st, log)

	conn, err := r.replicationConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if r.cfg.beforeStart != nil {
		r.cfg.beforeStart()
	}

	// LSN 0: the server starts at the slot's confirmed_flush_lsn and sends
	// every transaction that commits after it. No client-side filtering.
	// proto_version 1 on every major: 2-4 add only streaming of uncommitted
	// transactions, two-phase and parallel apply, none of which the relay
	// wants (it publishes committed rows; docs/postgresql.md).
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{
			"proto_version '1'",
			fmt.Sprintf("publication_names '%s'", r.cfg.Publication),
			"binary 'true'",
		},
	})
	if err != nil {
		switch {
		case pgerr.SlotInUse(err):
			return fmt.Errorf("%w: %s", errSlotBusy, pgerr.Message(err))
		case pgerr.SlotInvalidated(err):
			return slotLostError(r.cfg.Slot)
		}
		return fmt.Errorf("start replication on slot %q: %w", r.cfg.Slot, err)
	}
	// Everything that depends on where the stream starts (the LSN
	// tracker, the step in effect) takes it from here.
	start, err := startPosition(ctx, pool, r.cfg.Slot, conn.PID())
	if err != nil {
		return err
	}

	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &session{
		r:            r,
		cfg:          &r.cfg,
		log:          log,
		conn:         conn,
		pool:         pool,
		sink:         sink,
		tracker:      newLSNTracker(start),
		rels:         newRelations(),
		sctx:         sctx,
		inflights:    newInflights(sctx),
		failed:       make(chan struct{}),
		received:     start,
		lastReported: 0,
	}
	s.promise = s.acknowledged
	s.gate = newTopicGate(s, sink)
	s.own = &channelOut{side: migration.OldSide, sink: sink, namer: r.namer, gate: s.gate}
	s.own.layout = layoutOf(sink)
	r.lastAck.Store(time.Now().UnixNano())
	r.gate.Store(s.gate)
	defer r.gate.Store(nil)
	defer r.newGate.Store(nil)
	s.quar = &quarantiner{
		db: pool, queries: r.queries, tracker: s.tracker, metrics: r.metrics, logger: log, broker: r.broker(),
		in: make(chan quarantined, r.cfg.MaxInFlightRecords+1),
	}
	quarDone := make(chan struct{})
	go func() { defer close(quarDone); s.quar.run(sctx) }()
	defer func() { cancel(); <-quarDone }()
	if err := s.holdAggregates(ctx, pool); err != nil {
		return err
	}
	if err := s.loadRoute(ctx, pool, start); err != nil {
		return err
	}
	s.record = &slotRecorder{db: pool, slot: r.cfg.Slot, log: log}
	recCtx, recCancel := context.WithCancel(context.Background())
	recDone := make(chan struct{})
	go func() { defer close(recDone); s.record.run(recCtx) }()
	defer func() { recCancel(); <-recDone }()

	r.metrics.sessions.Inc()
	r.metrics.nSessions.Add(1)
	r.metrics.standby.Set(0)
	r.state.Store(int32(StateStreaming))
	log.Info("streaming from slot", slog.String("from_lsn", start.String()))

	err = s.stream(ctx)
	if err != nil {
		// Fail what is still buffered before the next session resends it,
		// so that no stale record lands after a resent one.
		// The relay's own sink replaces its client when the abort is cut
		// short; a Config.Sink cannot be replaced (see Sink).
		actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
		if aerr := sink.AbortBufferedRecords(actx); aerr != nil {
			log.Warn("aborting buffered "+r.broker()+" records failed; the next session produces through the same sink", slog.String("error", aerr.Error()))
		}
		// The same for a migration's new channel: a RabbitMQ sink gives
		// up its failed connection there, and the next session dials
		// a new one (kept, every probe of the next session would fail
		// on it, and the relay would stall).
		for name, ns := range r.newChannelSinks() {
			if aerr := ns.AbortBufferedRecords(actx); aerr != nil {
				log.Warn("aborting buffered records of the new channel failed", slog.String("plan", name), slog.String("error", aerr.Error()))
			}
		}
		acancel()
	}
	return err
}

func (r *Relay) replicationConn(ctx context.Context) (*pgconn.PgConn, error) {
	cfg := r.dbConfig.ConnConfig.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	// PostgreSQL drops this walsender after ServerTimeout without a status
	// update, which frees the slot of a frozen relay for a standby.
	cfg.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(r.cfg.ServerTimeout.Milliseconds(), 10)
	cfg.DialFunc = replsock.Dial(cfg.DialFunc, r.cfg.ReadWindow, r.metrics.replReads.Inc)
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		if pgerr.InsufficientPrivilege(err) {
			return nil, fmt.Errorf("%w: replication connection refused: role %q needs the REPLICATION attribute "+
				"(ALTER ROLE %s WITH REPLICATION; see docs/relay.md#least-privilege): %w", ErrFatal, cfg.User, cfg.User, err)
		}
		if pgerr.ConnectRefused(err) {
			return nil, fmt.Errorf("%w: replication connection: %w", ErrFatal, err)
		}
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	return conn, nil
}

// fail ends the session with err; the first error wins.
func (s *session) fail(err error) {
	s.failOnce.Do(func() {
		s.failErr = err
		close(s.failed)
	})
}

// stream reads the replication stream until ctx ends (then it stops
// cleanly) or something fails.
func (s *session) stream(ctx context.Context) error {
	s.stopping = ctx.Done()
	interval := s.cfg.StatusInterval
	nextStatus := time.Now() // report at once: it also tells the server who we are
	var stopBy time.Time     // set when ctx ends
	// heard is when the server last sent anything. Every status update asks
	// for a keepalive, so silence for ServerTimeout means the server or the
	// path to it is gone.
	heard := time.Now()
	defer s.abandonPending()
	// The socket beneath the stream, when it is one of replsock's (a
	// library user's DialFunc may give another): the loop runs once per
	// message, and takes the time of a message's arrival from the read that
	// brought it rather than from the clock, and moves the read deadline
	// once per deadlineSlack rather than per message.
	sock := replsock.Of(s.conn.Conn())

	for {
		select {
		case <-s.failed:
			return s.failErr
		default:
		}
		now := time.Now()
		if s.pending == nil {
			s.r.heartbeatAt(now) // a pending call beats as it goes (see pendingCall)
		}
		if ctx.Err() != nil && stopBy.IsZero() {
			stopBy = now.Add(s.cfg.ShutdownTimeout)
			s.log.Info("stopping: finishing the current transaction and waiting for " + s.r.broker() + "'s acknowledgements")
		}
		if !stopBy.IsZero() && (s.open == nil || now.After(stopBy)) {
			// A step not applied yet is not confirmed either: the next
			// session applies it again.
			s.abandonPending()
			return s.stop(stopBy)
		}
		// Report at every interval, and promptly whenever the confirmed
		// position moved: what is acknowledged but unreported would be
		// published again after a crash.
		confirmed, n, b, _ := s.tracker.position()
		moved := confirmed != s.lastReported
		if periodic := !now.Before(nextStatus); periodic || (moved && now.Sub(s.lastReport) >= promptReport) {
			if err := s.report(periodic); err != nil {
				return err
			}
			nextStatus = now.Add(interval)
			moved = false
		}
		deadline := nextStatus
		if n > 0 || moved {
			deadline = now.Add(promptReport)
		}
		if !stopBy.IsZero() && stopBy.Before(deadline) {
			deadline = stopBy
		}

		// A pending call: read no further, keep reporting (above).
		if s.pending != nil {
			stopping := ctx.Done()
			if !stopBy.IsZero() {
				stopping = nil
			}
			ended, err := s.waitPending(deadline, stopping)
			heard = time.Now() // not reading is no evidence of silence
			if ended && err != nil {
				if ctx.Err() == nil {
					return err
				}
				// Cut short by the stop: what it was for is not
				// confirmed, and nothing after it is read.
				if stopBy.IsZero() {
					stopBy = time.Now().Add(s.cfg.ShutdownTimeout)
				}
				return s.stop(stopBy)
			}
			continue
		}

		// Back-pressure: read no further while the budget is spent. It
		// counts what a crash would publish again, not only what Kafka has
		// yet to acknowledge: a partition that stops acknowledging holds
		// the confirmed position, and what flows past it counts too.
		s.releaseNew()
		if s.stepReady() {
			s.await(s.applyStep, nil)
			continue
		}
		stepWaits := s.step != nil && s.step.end != 0
		if stepWaits || n >= s.cfg.MaxInFlightRecords || b >= s.cfg.MaxInFlightBytes {
			stopping := ctx.Done()
			if !stopBy.IsZero() {
				stopping = nil // already stopping: wait for space or the deadline
			}
			timer := time.NewTimer(max(time.Until(deadline), 0))
			select {
			case <-s.tracker.space:
			case <-s.failed:
			case <-stopping:
			case <-timer.C:
			}
			timer.Stop()
			heard = time.Now() // not reading is no evidence of silence
			continue
		}

		silentUntil := heard.Add(s.cfg.ServerTimeout)
		if silentUntil.Before(deadline) {
			deadline = silentUntil
		}
		if sock != nil {
			_ = sock.ReadDeadlineBy(deadline, deadlineSlack)
		} else {
			_ = s.conn.Conn().SetReadDeadline(deadline)
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				if !time.Now().Before(silentUntil) {
					return fmt.Errorf("%w: nothing from PostgreSQL for %s although every status update asks for a keepalive: "+
						"the server or the network path is gone; reconnecting", errServerSilent, s.cfg.ServerTimeout)
				}
				continue
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		if sock == nil {
			heard = time.Now()
		} else if at := sock.ReadAt(); at.After(heard) {
			// Not before a wait that set heard (a message read before
			// it, taken after it, is no evidence of silence during it).
			heard = at
		}
		s.heard = heard
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			replyNow, err := s.handleCopyData(msg.Data)
			if err != nil {
				return err
			}
			if replyNow {
				nextStatus = time.Now()
			}
		case *pgproto3.ErrorResponse:
			return s.serverError(pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("server ended the replication stream")
		}
	}
}

func (s *session) serverError(err *pgconn.PgError) error {
	switch {
	case pgerr.PublicationMissing(err):
		return fmt.Errorf("%w: %s; recreate it: CREATE PUBLICATION %s FOR TABLE outbox, ferry_migration_step WITH (publish = 'insert')", ErrPublicationMissing, err.Message, s.cfg.Publication)
	case pgerr.SlotInvalidated(err):
		return slotLostError(s.cfg.Slot)
	}
	return fmt.Errorf("replication stream: %w", err)
}

// handleCopyData processes one message of the stream. It reports whether the
// server asked for an immediate status update.
func (s *session) handleCopyData(data []byte) (replyNow bool, err error) {
	if len(data) == 0 {
		return false, nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		s.r.metrics.keepalives.Inc()
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("parse keepalive: %w", err)
		}
		if s.open == nil {
			s.tracker.idle(ka.ServerWALEnd)
		}
		return ka.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		s.r.metrics.walMessages.Inc()
		start, wal, err := decodeXLogData(data[1:])
		if err != nil {
			return false, err
		}
		if end := start + pglogrepl.LSN(len(wal)); end > s.received {
			s.received = end
		}
		return false, s.handleWAL(wal)
	}
	return false, nil
}

// handleWAL processes one pgoutput message. data is pgproto3's buffer,
// which the next receive reuses: what outlives this call (an insert's
// values, in flight until acknowledged) is copied out of it.
func (s *session) handleWAL(data []byte) error {
	if len(data) == 0 {
		return errors.New("empty pgoutput message")
	}
	switch data[0] {
	case byte(pglogrepl.MessageTypeBegin):
		// Begin and Commit come with every transaction: decoded in place,
		// without pglogrepl's allocations.
		final, commit, err := decodeBegin(data)
		if err != nil {
			return err
		}
		s.open = s.tracker.begin()
		s.openLSN, s.openCommit = final, commit
		return nil
	case byte(pglogrepl.MessageTypeCommit):
		if s.open == nil {
			return errors.New("commit without begin")
		}
		end, commit, err := decodeCommit(data)
		if err != nil {
			return err
		}
		s.r.metrics.commitToReceive.Observe(s.heard.Sub(commit).Seconds())
		s.tracker.commit(s.open, end, commit)
		if s.step != nil && s.step.tx == s.open {
			s.step.end = end // reads no further until it applies
		}
		s.open = nil
		return nil
	case byte(pglogrepl.MessageTypeInsert):
		// The hot path: decoded in place, without pglogrepl's allocations.
		if s.open == nil {
			return errors.New("insert outside a transaction")
		}
		data = bytes.Clone(data)
		p := s.inflights.get()
		ok, err := s.rels.decodeInsert(data, &p.row)
		if err != nil {
			return err
		}
		if ok {
			s.publish(p)
			return nil
		}
		st, ok, err := s.rels.decodeStep(data)
		if ok {
			s.noteStep(st)
		}
		return err
	}
	msg, err := pglogrepl.Parse(bytes.Clone(data))
	if err != nil {
		return fmt.Errorf("parse pgoutput message: %w", err)
	}
	if m, ok := msg.(*pglogrepl.RelationMessage); ok {
		return s.rels.add(m)
	}
	return nil
}

// publish hands one event to Kafka, or straight to quarantine when its topic
// name can never be valid.
func (s *session) publish(p *inflight) {
	s.seq++
	p.tx, p.commit, p.lsn, p.seq, p.heard = s.open, s.openCommit, s.openLSN, s.seq, s.heard
	if s.route != nil {
		s.publishRouted(p)
		return
	}
	topic := s.r.namer.topic(&p.row)
	p.fill(topic.name, s.cfg.CloudEvents)
	s.r.tracing.start(p)
	p.out = s.own
	s.tracker.produce(p.tx, p.size)
	if s.hold != nil && !s.hold.admit(s.sctx, p) {
		return // behind an earlier event of its aggregate: waiting, or quarantined
	}
	s.send(p, topic.problem)
}

// send hands a record whose turn it is to Kafka, or to quarantine: when
// its topic is one the relay will not write to (topicProblem), or when the
// row's own headers use a name Ferry reserves.
func (s *session) send(p *inflight, topicProblem string) {
	if p.out.side == migration.NewSide && !p.out.track(p, p.tx, p.size, p.copy) {
		s.tracker.ackOne(p.tx, p.size, p.copy) // its channel was given up (releaseNew)
		return
	}
	if topicProblem != "" {
		s.quarantine(quarantined{p: p, reason: ReasonInvalidTopic, err: errors.New(topicProblem)})
		return
	}
	if name, ok := p.reservedHeader(s.cfg.CloudEvents); ok {
		s.quarantine(quarantined{p: p, reason: ReasonReservedHeader,
			err: fmt.Errorf("the row's headers use %q, a name Ferry reserves (outbox.IsReservedHeader): published, it could pose as Ferry's own", name)})
		return
	}
	if s.cfg.unsafeConfirmOnSend {
		p.out.sink.Produce(s.sctx, &p.rec, func(*kgo.Record, error) {})
		if p.out.side != migration.NewSide || p.out.settle(p) {
			s.tracker.ackOne(p.tx, p.size, p.copy)
		}
		return
	}
	if !p.out.gate.admit(p) {
		return // its topic is held: the gate sends it in order
	}
	p.out.sink.Produce(s.sctx, &p.rec, s.promise)
}

// acknowledged is the promise of every record of the session.
func (s *session) acknowledged(rec *kgo.Record, err error) {
	p := rec.Context.(*inflight)
	now := time.Now()
	s.r.lastAck.Store(now.UnixNano())
	newSide := p.out.side == migration.NewSide
	if newSide && p.out.released.Load() {
		return // given up with its channel (releaseNew), acknowledged then
	}
	if err == nil {
		if newSide && !p.out.settle(p) {
			return
		}
		p.out.gate.accepted(p)
		s.r.metrics.published.Inc()
		s.r.metrics.nPublished.Add(1)
		s.r.metrics.bytes.Add(float64(len(rec.Value)))
		p.endSpan(nil)
		s.r.metrics.commitToAck.Observe(now.Sub(p.commit).Seconds())
		if !p.heard.IsZero() {
			s.r.metrics.receiveToAck.Observe(now.Sub(p.heard).Seconds())
		}
		s.tracker.ackOne(p.tx, p.size, p.copy)
		if p.copies != nil {
			p.copies.Inc()
		}
		if s.hold != nil && !p.shadow {
			s.hold.acknowledged(p)
		}
		if recycles(p.out.sink) {
			s.inflights.put(p)
		}
		return
	}
	if reason, ok := permanentReason(err); ok {
		s.quarantine(quarantined{p: p, reason: reason, err: err})
		return
	}
	if class, ok := refusalOf(err); ok {
		p.out.gate.refuse(p, class, err)
		return
	}
	p.endSpan(err)
	s.fail(fmt.Errorf("%s refused record for topic %s: %w", s.r.brokerLower(), rec.Topic, err))
}

// report sends a standby status update. Flush and apply are the confirmed
// position, set explicitly (pglogrepl would put the write position in a
// zero flush). It asks for a reply on the periodic update, whose keepalive
// proves the server alive (see Config.ServerTimeout), and whenever nothing
// is pending, because the keepalive's WAL end lets an idle outbox confirm.
func (s *session) report(periodic bool) error {
	confirmed, window, _, busy := s.tracker.position()
	if confirmed == 0 {
		return errors.New("no confirmed position to report")
	}
	flush := confirmed
	if h := pglogrepl.LSN(s.cfg.holdFlush); h != 0 {
		flush = min(flush, h) // a test's (HoldConfirmedFlush)
	}
	write := max(s.received, flush)
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write,
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       time.Now(),
		ReplyRequested:   periodic || (!busy && s.open == nil),
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	s.r.metrics.statusUpdates.Inc()
	s.tracker.reported(flush)
	n := s.tracker.unacknowledged()
	s.r.metrics.inFlight.Set(float64(n))
	s.r.metrics.unconfirmed.Set(float64(window))
	s.lastReport = time.Now()
	if confirmed != s.lastReported {
		s.lastReported = confirmed
		if s.record != nil {
			_, at := s.tracker.confirmedCommit()
			s.record.note(confirmed, at)
		}
		s.r.metrics.confirmedLSN.Set(float64(confirmed))
		s.r.metrics.lastConfirmed.Store(uint64(confirmed))
		if s.log.Enabled(context.Background(), slog.LevelDebug) { // the LSN's text costs a Sprintf
			s.log.Debug("confirmed", slog.String("lsn", confirmed.String()), slog.Int("in_flight", n))
		}
	}
	return nil
}

// stop ends a session on request: it waits until Kafka acknowledged every
// record in flight (or until the deadline), confirms, and ends the stream.
func (s *session) stop(deadline time.Time) error {
	tick := time.NewTicker(s.cfg.StatusInterval)
	defer tick.Stop()
	for {
		s.r.heartbeat()
		_, n, _, _ := s.tracker.position()
		if n == 0 || !time.Now().Before(deadline) {
			break
		}
		timer := time.NewTimer(time.Until(deadline))
		select {
		case <-s.tracker.space:
		case <-tick.C:
			if err := s.report(false); err != nil {
				timer.Stop()
				return err
			}
		case <-s.failed:
			timer.Stop()
			return s.failErr
		case <-timer.C:
		}
		timer.Stop()
	}
	if err := s.report(false); err != nil {
		return err
	}
	confirmed, n, _, _ := s.tracker.position()
	if n > 0 {
		s.log.Warn("shutdown timeout: records still in flight will be published again by the next relay",
			slog.Int("in_flight", n), slog.String("confirmed_lsn", confirmed.String()))
	}
	_ = s.conn.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), s.conn); err != nil {
		s.log.Debug("end of replication stream", slog.String("error", err.Error()))
	}
	s.log.Info("stopped", slog.String("confirmed_lsn", confirmed.String()))
	return nil
}
