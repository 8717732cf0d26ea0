package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/pgerr"
)

func pgError(code, msg string) error {
	// Wrapped, as the engines see it after fmt.Errorf("...: %w").
	return fmt.Errorf("doing something: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: msg})
}

// retryable is what pgconn returns when a statement never reached the server.
type retryable struct{}

func (retryable) Error() string     { return "conn busy" }
func (retryable) SafeToRetry() bool { return true }

// connectError is a real *pgconn.ConnectError: nothing listens on port 1.
func connectError(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, "postgres://nobody@127.0.0.1:1/nothing?connect_timeout=2&sslmode=disable")
	if err == nil {
		conn.Close(ctx)
		t.Skip("something listens on 127.0.0.1:1")
	}
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("connect to port 1 = %T %v, want a *pgconn.ConnectError", err, err)
	}
	return err
}

func TestPredicates(t *testing.T) {
	t.Parallel()
	refusedConnect := connectError(t)
	type predicate struct {
		name string
		f    func(error) bool
	}
	unreachable := predicate{"Unreachable", pgerr.Unreachable}
	refused := predicate{"ConnectRefused", pgerr.ConnectRefused}
	duplicate := predicate{"DuplicateObject", pgerr.DuplicateObject}
	undefinedTable := predicate{"UndefinedTable", pgerr.UndefinedTable}
	inUse := predicate{"SlotInUse", pgerr.SlotInUse}
	invalidated := predicate{"SlotInvalidated", pgerr.SlotInvalidated}
	noPublication := predicate{"PublicationMissing", pgerr.PublicationMissing}
	transient := predicate{"Transient", pgerr.Transient}
	all := []predicate{unreachable, refused, duplicate, undefinedTable, inUse, invalidated, noPublication, transient}

	for _, tc := range []struct {
		name string
		err  error
		true []predicate // every other predicate must be false
	}{
		{"nil", nil, nil},
		{"plain error", errors.New("boom"), nil},
		{"context canceled", context.Canceled, nil},
		{"connection failure", pgError(pgerrcode.ConnectionFailure, "connection failure"), []predicate{unreachable}},
		{"connection exception", pgError(pgerrcode.ConnectionException, "connection exception"), []predicate{unreachable}},
		{"admin shutdown", pgError(pgerrcode.AdminShutdown, "terminating connection due to administrator command"), []predicate{unreachable}},
		{"crash shutdown", pgError(pgerrcode.CrashShutdown, "terminating connection because of crash of another server process"), []predicate{unreachable}},
		{"cannot connect now", pgError(pgerrcode.CannotConnectNow, "the database system is starting up"), []predicate{unreachable}},
		{"too many connections", pgError(pgerrcode.TooManyConnections, "sorry, too many clients already"), []predicate{unreachable}},
		{"connect error", refusedConnect, []predicate{unreachable}},
		{"safe to retry", fmt.Errorf("query: %w", retryable{}), []predicate{unreachable}},
		{"bad password", pgError(pgerrcode.InvalidPassword, `password authentication failed for user "x"`), []predicate{refused}},
		{"no such role", pgError(pgerrcode.InvalidAuthorizationSpecification, `role "x" does not exist`), []predicate{refused}},
		{"no such database", pgError(pgerrcode.InvalidCatalogName, `database "x" does not exist`), []predicate{refused}},
		{"duplicate object", pgError(pgerrcode.DuplicateObject, `replication slot "ferry" already exists`), []predicate{duplicate}},
		{"undefined table", pgError(pgerrcode.UndefinedTable, `relation "inbox" does not exist`), []predicate{undefinedTable}},
		{"slot in use", pgError(pgerrcode.ObjectInUse, `replication slot "ferry" is active for PID 42`), []predicate{inUse}},
		{"slot invalidated", pgError(pgerrcode.ObjectNotInPrerequisiteState, `can no longer get changes from replication slot "ferry"`), []predicate{invalidated}},
		{"other prerequisite state", pgError(pgerrcode.ObjectNotInPrerequisiteState, `logical decoding requires wal_level >= logical`), nil},
		{"publication missing", pgError(pgerrcode.UndefinedObject, `publication "ferry" does not exist`), []predicate{noPublication}},
		{"other undefined object", pgError(pgerrcode.UndefinedObject, `type "nope" does not exist`), nil},
		{"serialization failure", pgError(pgerrcode.SerializationFailure, "could not serialize access due to concurrent update"), []predicate{transient}},
		{"deadlock", pgError(pgerrcode.DeadlockDetected, "deadlock detected"), []predicate{transient}},
		{"transaction integrity constraint violation", pgError(pgerrcode.TransactionIntegrityConstraintViolation, "transaction integrity constraint violation"), nil},
		{"other transaction rollback", pgError(pgerrcode.TransactionRollback, "transaction rollback"), nil},
		{"unique violation", pgError(pgerrcode.UniqueViolation, "duplicate key value"), nil},
		{"syntax error", pgError(pgerrcode.SyntaxError, "syntax error"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range all {
				want := false
				for _, tp := range tc.true {
					want = want || tp.name == p.name
				}
				if got := p.f(tc.err); got != want {
					t.Errorf("%s(%v) = %t, want %t", p.name, tc.err, got, want)
				}
			}
		})
	}
}

// A server's refusal inside a *pgconn.ConnectError is an answer, not an
// outage: a wrong password must not be waited out.
func TestRefusalInsideConnectErrorIsNotUnreachable(t *testing.T) {
	t.Parallel()
	err := &wrapped{msg: "failed to connect", err: &pgconn.PgError{Code: pgerrcode.InvalidPassword}}
	if pgerr.Unreachable(err) {
		t.Error("Unreachable(bad password) = true")
	}
	if !pgerr.ConnectRefused(err) {
		t.Error("ConnectRefused(bad password) = false")
	}
}

type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg + ": " + w.err.Error() }
func (w *wrapped) Unwrap() error { return w.err }

func TestCodeIsAndMessage(t *testing.T) {
	t.Parallel()
	err := pgError(pgerrcode.UndefinedTable, `relation "inbox" does not exist`)
	if got := pgerr.Code(err); got != pgerrcode.UndefinedTable {
		t.Errorf("Code = %q, want %q", got, pgerrcode.UndefinedTable)
	}
	if !pgerr.Is(err, pgerrcode.UndefinedTable) || pgerr.Is(err, pgerrcode.UndefinedObject) {
		t.Error("Is does not compare the wrapped code")
	}
	if got := pgerr.Message(err); got != `relation "inbox" does not exist` {
		t.Errorf("Message = %q, want the server's message alone", got)
	}
	plain := errors.New("boom")
	if pgerr.Code(plain) != "" || pgerr.Is(plain, "") || pgerr.Code(nil) != "" {
		t.Error("an error without a PgError has a code")
	}
	if pgerr.Message(plain) != "boom" || pgerr.Message(nil) != "" {
		t.Error("Message of an error without a PgError is not its text")
	}
}
