// Package pgerr is where Ferry translates PostgreSQL errors: the relay and
// the worker ask it what an error means instead of comparing SQLSTATE codes
// themselves. Codes are pgerrcode's names, never string literals.
package pgerr

import (
	"errors"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Code returns the SQLSTATE of the *pgconn.PgError that err wraps, or ""
// when err carries none (a network error, a context error, nil).
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Is reports whether err wraps a *pgconn.PgError with the given SQLSTATE,
// one of pgerrcode's constants.
func Is(err error, code string) bool {
	return code != "" && Code(err) == code
}

// Message returns the server's message of the *pgconn.PgError that err
// wraps, without the severity and code pgconn adds, or err.Error() when err
// carries none.
func Message(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// Unreachable reports whether err means the database, not the statement,
// is the problem: the connection broke (class 08), the server is shutting
// down, restarting or not accepting connections yet (57P01, 57P02, 57P03),
// it has no connection slot free (53300), or pgx could not connect or says
// the statement never reached the server. Such failures are worth waiting
// out. Any other server error is about the statement, and is not.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	// A server error decides alone, even inside a *pgconn.ConnectError: a
	// refused password is an answer, not an outage.
	if code := Code(err); code != "" {
		switch code {
		case pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
			pgerrcode.TooManyConnections:
			return true
		}
		return pgerrcode.IsConnectionException(code)
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	return pgconn.SafeToRetry(err)
}

// Transient reports whether the server gave up on the transaction because
// of the transactions running beside it, not because of what it does: a
// deadlock (40P01, deadlock_detected) or a serialization failure (40001,
// serialization_failure). The same work run again, in a new transaction,
// normally succeeds. The other codes of class 40 are not this.
func Transient(err error) bool {
	switch Code(err) {
	case pgerrcode.DeadlockDetected, pgerrcode.SerializationFailure:
		return true
	}
	return false
}

// ConnectRefused reports whether the server refused a connection in a way
// that retrying cannot change: authentication failed (class 28) or the
// database does not exist (3D000).
func ConnectRefused(err error) bool {
	code := Code(err)
	return pgerrcode.IsInvalidAuthorizationSpecification(code) || code == pgerrcode.InvalidCatalogName
}

// InsufficientPrivilege reports whether the role lacks a privilege
// (42501): a walsender without the REPLICATION attribute, a table without
// GRANT. An administrator must act; retrying cannot change it.
func InsufficientPrivilege(err error) bool { return Is(err, pgerrcode.InsufficientPrivilege) }

// DuplicateObject reports whether a CREATE failed because the object exists
// (42710): for a slot or a publication, another process created it first.
func DuplicateObject(err error) bool { return Is(err, pgerrcode.DuplicateObject) }

// UndefinedTable reports whether a statement named a table that does not
// exist (42P01): the migrations have not run.
func UndefinedTable(err error) bool { return Is(err, pgerrcode.UndefinedTable) }

// SlotInUse reports whether START_REPLICATION found the slot held by another
// connection (55006, object_in_use).
func SlotInUse(err error) bool { return Is(err, pgerrcode.ObjectInUse) }

// SlotInvalidated reports whether PostgreSQL refuses a slot it invalidated
// because the WAL it needs was removed: 55000 (object not in prerequisite
// state) saying the slot "can no longer" be used. Other 55000 errors are not
// this.
func SlotInvalidated(err error) bool {
	return Is(err, pgerrcode.ObjectNotInPrerequisiteState) && strings.Contains(Message(err), "no longer")
}

// PublicationMissing reports whether the walsender cannot find the
// publication it was asked to stream (42704, undefined_object, about a
// publication). Other undefined objects are not this.
func PublicationMissing(err error) bool {
	return Is(err, pgerrcode.UndefinedObject) && strings.Contains(Message(err), "publication")
}

// DuplicateTable reports whether a CREATE TABLE failed because the table
// exists (42P07): for a partition, another process created it first.
func DuplicateTable(err error) bool { return Is(err, pgerrcode.DuplicateTable) }

// CheckViolation reports whether a row broke a CHECK constraint (23514),
// which includes a partition's bound: creating a partition whose range
// rows in the default partition already hold.
func CheckViolation(err error) bool { return Is(err, pgerrcode.CheckViolation) }
