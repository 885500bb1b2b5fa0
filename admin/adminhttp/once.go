package adminhttp

import (
	"crypto/rand"
	"net/http"
	"sync"

	"github.com/pgoutbox/pgoutbox/admin"
)

// Bounds of what the console remembers of its forms and actions.
const (
	// maxForms caps the submit-once tokens of forms not yet submitted (or
	// submitted and remembered); the oldest goes first, and its form then asks
	// for a reload.
	maxForms = 10000
	// maxOutcomes caps the actions' outcomes the result pages show; the
	// oldest goes first (the audit keeps every action).
	maxOutcomes = 1000
)

// Answers to a form whose token cannot run its action.
var (
	errFormUnknown = &httpError{status: http.StatusConflict,
		msg: "this form is not valid any more (it is too old, was made for another user, or the console restarted); reload the page and submit it again"}
	errFormRunning = &httpError{status: http.StatusConflict,
		msg: "this form was submitted already and its action is still running: nothing was done twice; the audit will show its outcome"}
)

// outcome is the server's record of one action the console ran: the result
// page shows it, never anything a link says.
type outcome struct {
	user   string // who ran it: only they see it
	notice string
	count  int    // the events acted on (the API's answer)
	url    string // the result page: the first answer's redirect, and any resubmission's
	replay *replayOutcome
}

// replayOutcome is what a replay's result page shows.
type replayOutcome struct {
	form   map[string]string
	result admin.ReplayResult
	failed string
}

type formState int

const (
	formOpen    formState = iota // issued, not submitted
	formRunning                  // submitted, its action running
	formDone                     // its action ran: result holds the outcome's id
)

type form struct {
	user   string
	state  formState
	result string
}

// actions makes every state change happen once: each form carries a token
// issued for its user; the first submission runs the action, a second one of
// the same form (a double click, a reload of the POST, the back button) only
// sees the first one's outcome. Outcomes are kept by an opaque id that the
// result page's link carries.
type actions struct {
	mu         sync.Mutex
	forms      map[string]*form
	formAge    []string // oldest first
	outcomes   map[string]*outcome
	outcomeAge []string
}

func newActions() *actions {
	return &actions{forms: map[string]*form{}, outcomes: map[string]*outcome{}}
}

// issue returns a new token for a form of user's.
func (a *actions) issue(user string) string {
	tok := rand.Text()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.formAge = evictOldest(a.forms, a.formAge, maxForms)
	a.forms[tok] = &form{user: user}
	a.formAge = append(a.formAge, tok)
	return tok
}

// begin claims the form of tok for user's action. It returns the outcome of
// the action the form ran already (the caller shows it and runs nothing), or
// an error when the form cannot run one; otherwise the caller runs the action
// and then calls finish, or abort when it did nothing.
func (a *actions) begin(tok, user string) (*outcome, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.forms[tok]
	switch {
	case tok == "" || f == nil || f.user != user:
		return nil, errFormUnknown
	case f.state == formRunning:
		return nil, errFormRunning
	case f.state == formDone:
		if o := a.outcomes[f.result]; o != nil {
			return o, nil
		}
		return nil, errFormUnknown
	}
	f.state = formRunning
	return nil, nil
}

// abort reopens the form of tok: its action did nothing (bad input, a
// conflict), so the corrected form may be submitted again.
func (a *actions) abort(tok string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f := a.forms[tok]; f != nil && f.state == formRunning {
		f.state = formOpen
	}
}

// finish records o as the outcome of the form of tok, its result page at
// url(id), and returns that page.
func (a *actions) finish(tok string, o *outcome, url func(id string) string) string {
	id := rand.Text() // 130 random bits: not guessed
	o.url = url(id)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.outcomeAge = evictOldest(a.outcomes, a.outcomeAge, maxOutcomes)
	a.outcomes[id] = o
	a.outcomeAge = append(a.outcomeAge, id)
	if f := a.forms[tok]; f != nil {
		f.state, f.result = formDone, id
	}
	return o.url
}

// outcome returns the outcome of id if user ran it, else nil: a link cannot
// show what did not happen, nor someone else's action.
func (a *actions) outcome(id, user string) *outcome {
	if id == "" {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if o := a.outcomes[id]; o != nil && o.user == user {
		return o
	}
	return nil
}

// evictOldest drops the oldest keys of m (age lists them, oldest first)
// until it has room for one more, and returns the keys left.
func evictOldest[K comparable, V any](m map[K]V, age []K, max int) []K {
	for len(age) >= max {
		delete(m, age[0])
		age = age[1:]
	}
	if cap(age) > 2*max { // let the dropped prefix go
		age = append([]K(nil), age...)
	}
	return age
}
