package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// Limits of error grouping and of the bulk actions.
const (
	// MaxSignatureInput bounds the error text a signature is made of: the
	// database sends at most this many characters of last_error, cut again
	// to as many bytes before any pattern runs.
	MaxSignatureInput = 1024
	// MaxBulk bounds the events one ErrorGroups call reads and one RetryBulk
	// or SkipBulk acts on.
	MaxBulk = 100000
)

// ErrCountChanged is wrapped by a bulk action whose selection no longer has
// the number of events its preview showed: nothing was done; preview again.
var ErrCountChanged = errors.New("admin: the selection changed since its preview")

// ErrTooMany is wrapped when a selection holds more than MaxBulk events.
var ErrTooMany = fmt.Errorf("admin: more than %d events selected; narrow the filter", MaxBulk)

var (
	sigURL    = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\s"'<>]+`)
	sigUUID   = regexp.MustCompile(`[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}`)
	sigHex    = regexp.MustCompile(`\b(?:0x)?[0-9A-Fa-f]{8,}\b`)
	sigNumber = regexp.MustCompile(`\d+(?:\.\d+)?`)
	// An HTTP status and its phrase, "503 Service Unavailable": the receiver's
	// answer, kept (not folded) and put first.
	sigStatus = regexp.MustCompile(`\b[1-5]\d\d [A-Z][A-Za-z]`)
)

// ErrorSignature is a failure's cause as grouping sees it: the error text
// with its ids, numbers and URLs folded, the receiver's answer first.
type ErrorSignature struct {
	// Answer is what the receiver or broker said (from an HTTP status on, or
	// the text after the last ": "), folded.
	Answer string `json:"answer"`
	// Where is the rest: what was being done (the adapter, the call), folded.
	Where string `json:"where,omitempty"`
}

// String is the signature as one line: the answer, then where.
func (s ErrorSignature) String() string {
	if s.Where == "" {
		return s.Answer
	}
	return s.Answer + " ‹ " + s.Where
}

// ID is the signature's opaque, stable id: what selects a group.
func (s ErrorSignature) ID() string {
	h := sha256.Sum256([]byte(s.Answer + "\x00" + s.Where))
	return hex.EncodeToString(h[:8])
}

// maxSignature bounds a signature's text.
const maxSignature = 512

// Signature normalises an error text (a broker's or receiver's, so hostile)
// into its cause: cut to MaxSignatureInput bytes first, controls made
// spaces, URLs folded to <url>, UUIDs to <id>, hex strings with digits to
// <hex>, other numbers to <n> (an HTTP status with its phrase is kept), white
// space collapsed; then split into the receiver's answer and where it came
// from.
func Signature(lastError string) ErrorSignature {
	s := cut(lastError, MaxSignatureInput)
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, s)
	s = sigURL.ReplaceAllString(s, "<url>")
	s = sigUUID.ReplaceAllString(s, "<id>")
	s = sigHex.ReplaceAllStringFunc(s, func(m string) string {
		if !strings.ContainsAny(m, "0123456789") {
			return m // a word
		}
		return "<hex>"
	})
	// Numbers, but an HTTP status followed by its phrase.
	var b strings.Builder
	last := 0
	for _, m := range sigNumber.FindAllStringIndex(s, -1) {
		if sigStatus.MatchString(s[m[0]:min(len(s), m[1]+3)]) && (m[0] == 0 || !isWord(s[m[0]-1])) {
			continue
		}
		b.WriteString(s[last:m[0]])
		b.WriteString("<n>")
		last = m[1]
	}
	b.WriteString(s[last:])
	s = strings.Join(strings.Fields(b.String()), " ")

	var sig ErrorSignature
	if loc := sigStatus.FindStringIndex(s); loc != nil {
		sig.Answer, sig.Where = s[loc[0]:], s[:loc[0]]
	} else if i := strings.LastIndex(s, ": "); i >= 0 {
		sig.Answer, sig.Where = s[i+2:], s[:i]
	} else {
		sig.Answer = s
	}
	sig.Where = strings.TrimRight(strings.TrimSpace(sig.Where), ":,;-")
	sig.Answer, sig.Where = cut(strings.TrimSpace(sig.Answer), maxSignature), cut(sig.Where, maxSignature)
	if sig.Answer == "" && sig.Where == "" {
		sig.Answer = "(no error text)"
	}
	return sig
}

func isWord(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// cut returns s cut to at most n bytes on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ErrorGroup is the dead letters and retrying events of one cause.
type ErrorGroup struct {
	// ID selects the group (ErrorSignature.ID); it is all an action takes.
	ID        string         `json:"id"`
	Signature ErrorSignature `json:"signature"`
	// DeadLetters counts its quarantined events, Retrying its events that
	// failed and will be tried again.
	DeadLetters int64 `json:"dead_letters"`
	Retrying    int64 `json:"retrying"`
	// FirstSeen and LastSeen span its events' quarantine times (for a
	// retrying event, which records no failure time, its occurrence).
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Aggregates counts the distinct aggregates affected; Examples names up
	// to five ("type/id"), and AggregateTypes every type (up to 20).
	Aggregates     int64    `json:"aggregates"`
	Examples       []string `json:"example_aggregates"`
	AggregateTypes []string `json:"aggregate_types"`
	// Example is one of its events, for its full error text.
	Example pgoutbox.UUID `json:"example_event_id"`
}

// ErrorGroups is what ErrorGroups found.
type ErrorGroups struct {
	Groups []ErrorGroup `json:"groups"`
	// Events counts the events read; Truncated says more than MaxBulk
	// failed and only the first MaxBulk (oldest first) were grouped.
	Events    int  `json:"events"`
	Truncated bool `json:"truncated"`
}

// failedSQL reads the failed events, dead letters and retrying ones, with at
// most MaxSignatureInput characters of their error text. It reads only
// unpublished rows, through their partial index.
const failedSQL = `SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.quarantined_at IS NOT NULL,
       coalesce(e.quarantined_at, e.occurred_at), left(coalesce(e.last_error, ''), %d)
  FROM %s e
 WHERE e.published_at IS NULL AND (e.quarantined_at IS NOT NULL OR e.attempt_count > 0)
 ORDER BY coalesce(e.quarantined_at, e.occurred_at), e.event_id
 LIMIT %d`

// ErrorGroups groups the dead letters and retrying events by the Signature
// of their last error: most dead letters first, then most retrying.
func (a *Admin) ErrorGroups(ctx context.Context) (*ErrorGroups, error) {
	rows, err := a.db.Query(ctx, fmt.Sprintf(failedSQL, MaxSignatureInput, a.events, MaxBulk+1))
	if err != nil {
		return nil, fmt.Errorf("admin: error groups: %w", err)
	}
	out := &ErrorGroups{Groups: []ErrorGroup{}}
	byID := map[string]*ErrorGroup{}
	aggs := map[string]map[string]bool{}
	var (
		id                      pgoutbox.UUID
		aggType, aggID, lastErr string
		quarantined             bool
		at                      time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &aggType, &aggID, &quarantined, &at, &lastErr}, func() error {
		if out.Events == MaxBulk {
			out.Truncated = true
			return nil
		}
		out.Events++
		sig := Signature(lastErr)
		key := sig.ID()
		g := byID[key]
		if g == nil {
			g = &ErrorGroup{ID: key, Signature: sig, FirstSeen: at, Example: id}
			byID[key], aggs[key] = g, map[string]bool{}
		}
		if quarantined {
			g.DeadLetters++
		} else {
			g.Retrying++
		}
		g.FirstSeen, g.LastSeen = minTime(g.FirstSeen, at), maxTime(g.LastSeen, at)
		agg := aggType + "/" + aggID
		if !aggs[key][agg] {
			aggs[key][agg] = true
			g.Aggregates++
			if len(g.Examples) < 5 {
				g.Examples = append(g.Examples, agg)
			}
			if len(g.AggregateTypes) < 20 && !containsString(g.AggregateTypes, aggType) {
				g.AggregateTypes = append(g.AggregateTypes, aggType)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin: error groups: %w", err)
	}
	for _, g := range byID {
		out.Groups = append(out.Groups, *g)
	}
	sort.Slice(out.Groups, func(i, j int) bool {
		a, b := out.Groups[i], out.Groups[j]
		if a.DeadLetters != b.DeadLetters {
			return a.DeadLetters > b.DeadLetters
		}
		if a.Retrying != b.Retrying {
			return a.Retrying > b.Retrying
		}
		return a.ID < b.ID
	})
	return out, nil
}

func minTime(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func containsString(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// BulkRequest selects dead letters for RetryBulk and SkipBulk: every
// quarantined event that Filter matches (its Limit is ignored; an empty
// Filter matches every one) and, when Group is set, whose error's Signature
// has that ID. Expect is the count the operator was shown (CountBulk): the
// action re-evaluates the selection in its transaction and does nothing,
// with an error wrapping ErrCountChanged, unless it finds exactly that many.
type BulkRequest struct {
	Filter Filter
	Group  string
	Expect int
	// Reason (required) and Actor are recorded in the operator audit.
	Reason string
	Actor  string
}

// CountBulk counts the dead letters a BulkRequest with f and group selects:
// the preview an operator confirms. More than MaxBulk is ErrTooMany.
func (a *Admin) CountBulk(ctx context.Context, f Filter, group string) (int, error) {
	if group != "" {
		ids, err := a.selectBulk(ctx, a.db, f, group, false)
		return len(ids), err
	}
	f.Limit = 0
	cond, args := f.where(nil)
	var n int
	err := queryRow(ctx, a.db, `SELECT count(*) FROM (SELECT 1 FROM `+a.events+` e
 WHERE e.published_at IS NULL AND e.quarantined_at IS NOT NULL`+cond+` LIMIT `+fmt.Sprint(MaxBulk+1)+`) c`, args, &n)
	switch {
	case err != nil:
		return 0, fmt.Errorf("admin: bulk selection: %w", err)
	case n > MaxBulk:
		return 0, fmt.Errorf("admin: bulk selection: %w", ErrTooMany)
	}
	return n, nil
}

// selectBulk returns the ids of the dead letters f and group select, oldest
// quarantine first, locking them when lock is set.
func (a *Admin) selectBulk(ctx context.Context, db DB, f Filter, group string, lock bool) ([]pgoutbox.UUID, error) {
	f.Limit = 0
	cond, args := f.where(nil)
	q := `SELECT e.event_id, left(coalesce(e.last_error, ''), ` + fmt.Sprint(MaxSignatureInput) + `)
  FROM ` + a.events + ` e
 WHERE e.published_at IS NULL AND e.quarantined_at IS NOT NULL` + cond + `
 ORDER BY e.quarantined_at, e.event_id LIMIT ` + fmt.Sprint(MaxBulk+1)
	if lock {
		q += " FOR UPDATE"
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("admin: bulk selection: %w", err)
	}
	var out []pgoutbox.UUID
	var id pgoutbox.UUID
	var lastErr string
	seen := 0
	_, err = pgx.ForEachRow(rows, []any{&id, &lastErr}, func() error {
		if seen++; seen > MaxBulk {
			return ErrTooMany
		}
		if group == "" || Signature(lastErr).ID() == group {
			out = append(out, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin: bulk selection: %w", err)
	}
	return out, nil
}

// bulk runs act on the dead letters req selects, in one transaction with the
// selection locked, if there are exactly req.Expect of them.
func (a *Admin) bulk(ctx context.Context, verb string, req BulkRequest, act func(tx pgx.Tx, ids []pgoutbox.UUID, actor, reason string, sel map[string]any) error) error {
	actor, reason, err := operator(req.Actor, req.Reason)
	if err == nil && strings.TrimSpace(req.Reason) == "" {
		err = ErrNoReason
	}
	if err != nil {
		return err
	}
	sel := map[string]any{"filter": req.Filter.audit(), "expected": req.Expect}
	if req.Group != "" {
		sel["error_group"] = req.Group
	}
	err = pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		ids, err := a.selectBulk(ctx, tx, req.Filter, req.Group, true)
		if err != nil {
			return err
		}
		if len(ids) != req.Expect {
			return fmt.Errorf("%w: %d events match now, %d were previewed (nothing done)", ErrCountChanged, len(ids), req.Expect)
		}
		if len(ids) == 0 {
			return ErrNoEvents
		}
		return act(tx, ids, actor, reason, sel)
	})
	if err != nil {
		return fmt.Errorf("admin: %s: %w", verb, err)
	}
	return nil
}

// RetryBulk retries the dead letters req selects (see RetryEvents) if their
// number is still req.Expect, with one audit row whose selection records the
// filter, the group and the count.
func (a *Admin) RetryBulk(ctx context.Context, req BulkRequest) ([]pgoutbox.UUID, error) {
	var out []pgoutbox.UUID
	err := a.bulk(ctx, "retry", req, func(tx pgx.Tx, ids []pgoutbox.UUID, actor, reason string, sel map[string]any) error {
		var err error
		if out, err = a.retry(ctx, tx, " AND e.event_id = ANY($2::uuid[])", []any{a.channel, ids}, 0); err != nil {
			return err
		}
		_, err = writeAudit(ctx, tx, a.schema, auditRecord{action: ActionRetry, actor: actor, reason: reason,
			selection: sel, ids: out, count: int64(len(out))})
		return err
	})
	return out, err
}

// SkipBulk skips the dead letters req selects (see Skip) if their number is
// still req.Expect, with one audit row as RetryBulk's.
func (a *Admin) SkipBulk(ctx context.Context, req BulkRequest) ([]Skipped, error) {
	var out []Skipped
	err := a.bulk(ctx, "skip", req, func(tx pgx.Tx, ids []pgoutbox.UUID, actor, reason string, sel map[string]any) error {
		var err error
		out, err = a.skipTx(ctx, tx, ids, reason, actor, sel)
		return err
	})
	return out, err
}
