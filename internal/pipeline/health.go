package pipeline

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Sentinels are the exported errors a source's Healthy returns (relay's and
// cdc's Err* variables), each joined with what the dependency said.
type Sentinels struct {
	DatabaseUnreachable error
	// PermissionDenied wraps migrate.ErrPermissionDenied.
	PermissionDenied    error
	BrokerUnreachable   error
	BrokerMisconfigured error
	// OutboxUnusable, when set, tells a statement refused for the outbox's
	// objects (a table or schema gone or altered: SQLSTATE classes 42 but
	// 42501, and 3F) apart from an unreachable database. Nil counts it as
	// unreachable.
	OutboxUnusable error
	// OutboxStuck, when set, tells a statement the server ended at the
	// source's bounds (pgbound.Stuck: a lock held by another session, a
	// statement past its timeout) apart from an unreachable database. Nil
	// counts it as unreachable.
	OutboxStuck error
}

// Health is the one record of a source's dependencies: the database
// (reachable, and per statement permitted and not stuck; the outbox usable)
// and the broker. It logs only the changes. Set its exported fields before
// first use; the methods are safe for concurrent use.
type Health struct {
	// Errs are the errors Errors returns.
	Errs Sentinels
	// Log receives the changes.
	Log *slog.Logger
	// Name is who runs the statements, in the logs: "the relay", "the CDC source".
	Name string
	// Role is the role of 'pgoutbox migrate print --grants' whose privileges
	// the source needs: "relay", "cdc".
	Role string
	// LockTimeout and StatementTimeout are the source's bounds, logged when a
	// statement is stuck (with Errs.OutboxStuck).
	LockTimeout, StatementTimeout time.Duration

	broker retry.BrokerHealth // what the last batch said about the broker
	down   atomic.Bool        // the database did not answer at the last contact
	// refusals counts the entries of denied, stuck and unusable: OK's fast
	// path when there is none.
	refusals atomic.Int32
	mu       sync.Mutex
	denied   map[string]error // per statement, a missing privilege until it succeeds again
	stuck    map[string]error // per statement, ended at the bounds until it succeeds again
	unusable error            // the last statement refused for the outbox's objects
}

// Failed records that statement stmt failed with err: the outbox unusable,
// stuck at the bounds, a missing privilege (the database answered, and will
// refuse again until someone grants it), or else the database unreachable.
// Each is retried with backoff by the caller. It reports whether err counted
// as the database unreachable.
func (h *Health) Failed(stmt string, err error) (unreachable bool) {
	switch {
	case h.Errs.OutboxUnusable != nil && outboxUnusable(err):
		retry.MarkUp(&h.down, h.Log, "database")
		if h.set(nil, stmt, err) {
			h.Log.Error("the outbox's tables are missing or altered; retrying with backoff", slog.Any("error", err))
		}
	case h.Errs.OutboxStuck != nil && pgbound.Stuck(err):
		// The database answered: not down, and its connections are fine.
		retry.MarkUp(&h.down, h.Log, "database")
		if h.set(&h.stuck, stmt, err) {
			h.Log.Warn("the outbox's statements time out: another session holds a lock on its tables, or they run too long; retrying with backoff, the other outboxes go on",
				slog.Duration("lock_timeout", h.LockTimeout), slog.Duration("statement_timeout", h.StatementTimeout), slog.Any("error", err))
		}
	case migrate.IsPermissionDenied(err):
		retry.MarkUp(&h.down, h.Log, "database")
		if h.set(&h.denied, stmt, err) {
			h.Log.Error(fmt.Sprintf("permission denied: %s's role lacks a privilege; grant what 'pgoutbox migrate print --grants' lists for the %s role (docs/security.md); retrying with backoff", h.Name, h.Role),
				slog.Any("error", err))
		}
	default:
		h.Unreachable(err)
		return true
	}
	return false
}

// set records err for stmt in *m (the outbox's objects when m is nil), and
// reports whether it is new.
func (h *Health) set(m *map[string]error, stmt string, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m == nil {
		known := h.unusable != nil
		if !known {
			h.refusals.Add(1)
		}
		h.unusable = err
		return !known
	}
	if *m == nil {
		*m = map[string]error{}
	}
	_, known := (*m)[stmt]
	if !known {
		h.refusals.Add(1)
	}
	(*m)[stmt] = err
	return !known
}

// OK records that statement stmt succeeded: the database answers, the outbox
// is usable, and stmt is permitted and not stuck.
func (h *Health) OK(stmt string) {
	if h.refusals.Load() > 0 {
		h.mu.Lock()
		unusable := h.unusable != nil
		_, denied := h.denied[stmt]
		_, stuck := h.stuck[stmt]
		h.unusable = nil
		delete(h.denied, stmt)
		delete(h.stuck, stmt)
		h.refusals.Store(int32(len(h.denied) + len(h.stuck)))
		h.mu.Unlock()
		if unusable {
			h.Log.Info("the outbox's tables are usable again")
		}
		if denied {
			h.Log.Info(h.Name+"'s statements are permitted again", slog.String("statement", stmt))
		}
		if stuck {
			h.Log.Info("the outbox's statements complete again")
		}
	}
	h.Reachable()
}

// Unreachable records that the database did not answer.
func (h *Health) Unreachable(err error) { retry.MarkDown(&h.down, h.Log, "database", err) }

// Reachable records that the database answered.
func (h *Health) Reachable() { retry.MarkUp(&h.down, h.Log, "database") }

// Refused reports whether the database refused stmt's last run for a reason
// it gave: the outbox unusable, a missing privilege, or stuck at the bounds.
func (h *Health) Refused(stmt string) bool {
	if h.refusals.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, denied := h.denied[stmt]
	_, stuck := h.stuck[stmt]
	return h.unusable != nil || denied || stuck
}

// Settled records what a batch said about the broker (Judged.Broker).
func (h *Health) Settled(o retry.BatchOutcome) { h.broker.Settled(h.Log, o) }

// Errors returns what is wrong, for Healthy: the database unreachable, each
// statement denied (by statement name), the outbox unusable, each statement
// stuck, the broker unreachable or refusing the configuration. Each error is
// the matching Errs sentinel joined with the cause, so that errors.Is tells
// them apart.
func (h *Health) Errors() []error {
	var errs []error
	if h.down.Load() {
		errs = append(errs, h.Errs.DatabaseUnreachable)
	}
	h.mu.Lock()
	for _, stmt := range slices.Sorted(maps.Keys(h.denied)) {
		errs = append(errs, fmt.Errorf("%w: %w", h.Errs.PermissionDenied, h.denied[stmt]))
	}
	if h.unusable != nil {
		errs = append(errs, fmt.Errorf("%w: %w", h.Errs.OutboxUnusable, h.unusable))
	}
	for _, stmt := range slices.Sorted(maps.Keys(h.stuck)) {
		errs = append(errs, fmt.Errorf("%w: %w", h.Errs.OutboxStuck, h.stuck[stmt]))
	}
	h.mu.Unlock()
	return append(errs, h.broker.Errors(h.Errs.BrokerUnreachable, h.Errs.BrokerMisconfigured)...)
}

// outboxUnusable reports whether err is the database refusing a statement
// for the outbox's objects: undefined or wrong tables, columns, functions
// (SQLSTATE class 42 but a missing privilege) or schema (class 3F).
func outboxUnusable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code == "42501" {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "42") || strings.HasPrefix(pgErr.Code, "3F")
}
