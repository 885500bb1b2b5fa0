// Package failpoint places named fault-injection points at pgoutbox's crash
// boundaries. Points are compiled into every binary and inert unless enabled: an
// Inject call costs one atomic load when nothing is enabled.
//
// Points are enabled by the environment variable PGOUTBOX_FAILPOINTS, read once
// at start-up, or by Enable in tests:
//
//	PGOUTBOX_FAILPOINTS='relay/after-publish=crash;relay/claim=3*error'
//
// Each entry is name=[N*]action, where action is one of
//
//	crash        the process kills itself with SIGKILL (no deferred code, no flush)
//	error        Inject returns an error wrapping ErrInjected
//	delay(D)     Inject sleeps for D (a Go duration), then returns nil
//	off          the point does nothing
//
// and N* triggers the action only on the N-th hit of the point (1-based); the
// other hits do nothing. Without N the action runs on every hit.
package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// EnvVar is the environment variable read at start-up.
const EnvVar = "PGOUTBOX_FAILPOINTS"

// The named points, one per crash boundary (docs/design.md, "What every crash
// leaves behind" and "Verification").
const (
	ProducerBeforeCommit = "producer/before-commit" // producer: outbox rows written, commit not sent
	ProducerAfterCommit  = "producer/after-commit"  // producer: committed, caller not yet told
	RelayClaim           = "relay/claim"            // relay: claim statement sent, leased rows not read
	RelayBeforePublish   = "relay/before-publish"   // relay: batch leased, nothing published
	RelayAfterPublish    = "relay/after-publish"    // relay: broker acknowledged, published_at not set
	RelayMark            = "relay/mark"             // relay: settle statements sent, outcome not read
	ConsumerAfterCommit  = "consumer/after-commit"  // consumer: effect committed, broker not acked
	CleanupMidBatch      = "cleanup/mid-batch"      // cleanup: some batches deleted, more to go
	CDCAfterPublish      = "cdc/after-publish"      // CDC source: broker acknowledged, neither marked nor LSN confirmed
)

// Points lists every named point.
var Points = []string{
	ProducerBeforeCommit, ProducerAfterCommit, RelayClaim, RelayBeforePublish,
	RelayAfterPublish, RelayMark, ConsumerAfterCommit, CleanupMidBatch, CDCAfterPublish,
}

// ErrInjected is wrapped by the errors the "error" action returns.
var ErrInjected = errors.New("failpoint: injected error")

type kind int

const (
	kindOff kind = iota
	kindCrash
	kindError
	kindDelay
)

type point struct {
	kind  kind
	delay time.Duration
	nth   int64 // 0: every hit
	hits  atomic.Int64
}

var (
	mu      sync.Mutex
	active  atomic.Pointer[map[string]*point]
	envErr  error
	crashFn = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
)

func init() {
	if v := os.Getenv(EnvVar); v != "" {
		envErr = Parse(v)
		if envErr != nil {
			envErr = fmt.Errorf("%s: %w", EnvVar, envErr)
		}
	}
}

// EnvError reports a malformed PGOUTBOX_FAILPOINTS, so that a command can refuse
// to start rather than run without the faults it was asked to inject.
func EnvError() error { return envErr }

// Parse enables the points described by spec ("name=action;name=action"),
// replacing every point enabled before.
func Parse(spec string) error {
	m := map[string]*point{}
	for entry := range strings.SplitSeq(spec, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, action, ok := strings.Cut(entry, "=")
		if !ok {
			return fmt.Errorf("failpoint: %q: want name=action", entry)
		}
		p, err := parseAction(strings.TrimSpace(action))
		if err != nil {
			return fmt.Errorf("failpoint %s: %w", name, err)
		}
		m[strings.TrimSpace(name)] = p
	}
	install(m)
	return nil
}

func parseAction(s string) (*point, error) {
	p := &point{}
	if n, rest, ok := strings.Cut(s, "*"); ok {
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q: the count before * must be a positive integer", s)
		}
		p.nth, s = v, rest
	}
	switch {
	case s == "off":
		p.kind = kindOff
	case s == "crash":
		p.kind = kindCrash
	case s == "error":
		p.kind = kindError
	case strings.HasPrefix(s, "delay(") && strings.HasSuffix(s, ")"):
		d, err := time.ParseDuration(s[len("delay(") : len(s)-1])
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q: bad delay", s)
		}
		p.kind, p.delay = kindDelay, d
	default:
		return nil, fmt.Errorf("unknown action %q (want crash, error, delay(D) or off)", s)
	}
	return p, nil
}

// Enable enables one point with an action in Parse's syntax ("crash", "2*error",
// "delay(50ms)"), keeping the others.
func Enable(name, action string) error {
	p, err := parseAction(action)
	if err != nil {
		return fmt.Errorf("failpoint %s: %w", name, err)
	}
	mu.Lock()
	defer mu.Unlock()
	m := map[string]*point{}
	if cur := active.Load(); cur != nil {
		for k, v := range *cur {
			m[k] = v
		}
	}
	m[name] = p
	active.Store(&m)
	return nil
}

// Disable turns one point off.
func Disable(name string) {
	mu.Lock()
	defer mu.Unlock()
	cur := active.Load()
	if cur == nil {
		return
	}
	m := map[string]*point{}
	for k, v := range *cur {
		if k != name {
			m[k] = v
		}
	}
	if len(m) == 0 {
		active.Store(nil)
		return
	}
	active.Store(&m)
}

func install(m map[string]*point) {
	mu.Lock()
	defer mu.Unlock()
	if len(m) == 0 {
		active.Store(nil)
		return
	}
	active.Store(&m)
}

// Inject runs the action enabled for the named point, if any. It returns an error
// only for the "error" action; "crash" does not return.
func Inject(name string) error {
	m := active.Load()
	if m == nil {
		return nil
	}
	p := (*m)[name]
	if p == nil {
		return nil
	}
	hit := p.hits.Add(1)
	if p.nth != 0 && hit != p.nth {
		return nil
	}
	switch p.kind {
	case kindCrash:
		fmt.Fprintf(os.Stderr, "failpoint %s: crash (SIGKILL)\n", name)
		crashFn()
	case kindError:
		return fmt.Errorf("failpoint %s: %w", name, ErrInjected)
	case kindDelay:
		time.Sleep(p.delay)
	}
	return nil
}
