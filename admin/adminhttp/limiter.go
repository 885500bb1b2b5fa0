package adminhttp

import (
	"container/list"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Sign-in limits. Each failed sign-in takes a token from the bucket of its
// client, of the user it named (when that user exists) and of the whole
// console; an attempt that finds one of them empty is answered 429 with
// Retry-After, without its credentials being checked.
var (
	// perClient: 10 failures at once, then one every 6 seconds (10 a minute).
	perClient = policy{burst: 10, every: 6 * time.Second}
	// perUser: 20 failures at once against one user, then 10 a minute, from
	// however many clients.
	perUser = policy{burst: 20, every: 6 * time.Second}
	// everyone: 100 failures at once, then one a second, over all clients.
	everyone = policy{burst: 100, every: time.Second}
)

// Bounds of the limiter's memory and of the log it writes.
const (
	// maxClients caps the clients tracked; the one seen least recently goes first.
	maxClients = 10000
	// logWindow is the period of the failure log: a client's first failure is
	// logged at once, the next ones as one line with their count once a window
	// has passed since its previous line.
	logWindow = time.Minute
	// maxLogLines caps the failure lines of one window over every client; the
	// failures past it are counted on the next line written (other_failures).
	maxLogLines = 20
)

// policy is a token bucket: burst tokens, one more every period.
type policy struct {
	burst int
	every time.Duration
}

// bucket is the state of one policy's bucket.
type bucket struct {
	tokens float64
	at     time.Time
	used   bool
}

// take takes a token at now, or says how long until one is there.
func (b *bucket) take(p policy, now time.Time) time.Duration {
	b.fill(p, now)
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration((1 - b.tokens) * float64(p.every))
}

// refund gives back a token taken by an attempt that succeeded.
func (b *bucket) refund(p policy) { b.tokens = min(b.tokens+1, float64(p.burst)) }

func (b *bucket) fill(p policy, now time.Time) {
	if !b.used {
		b.tokens, b.at, b.used = float64(p.burst), now, true
		return
	}
	if now.After(b.at) {
		b.tokens = min(float64(p.burst), b.tokens+float64(now.Sub(b.at))/float64(p.every))
		b.at = now
	}
}

// client is what the limiter keeps of one client (or user).
type client struct {
	key      string
	bucket   bucket
	failures int       // failures not yet logged
	limited  int       // 429 answers not yet logged
	lastLine time.Time // of this client's previous log line; zero: none yet
}

// keyed holds the buckets of clients or users, at most max of them.
type keyed struct {
	p     policy
	max   int
	m     map[string]*list.Element
	order *list.List // of *client, most recently seen first
}

func newKeyed(p policy, max int) *keyed {
	return &keyed{p: p, max: max, m: map[string]*list.Element{}, order: list.New()}
}

// get returns the client of key, making it (and forgetting the least recently
// seen one past max; evicted returns it).
func (k *keyed) get(key string) (c, evicted *client) {
	if el, ok := k.m[key]; ok {
		k.order.MoveToFront(el)
		return el.Value.(*client), nil
	}
	if k.order.Len() >= k.max {
		last := k.order.Back()
		evicted = k.order.Remove(last).(*client)
		delete(k.m, evicted.key)
	}
	c = &client{key: key}
	k.m[key] = k.order.PushFront(c)
	return c, evicted
}

// limiter slows down guessing: see the policies above. Its memory and the log
// lines it writes are bounded.
type limiter struct {
	now func() time.Time
	log *slog.Logger

	mu      sync.Mutex
	clients *keyed
	users   *keyed
	all     bucket
	// Log lines of the current window over every client, and the failures and
	// refusals no line reported yet (past maxLogLines, or of evicted clients).
	window             time.Time
	lines              int
	unlogged, unlimits int
}

func newLimiter(log *slog.Logger, now func() time.Time) *limiter {
	return &limiter{now: now, log: log, clients: newKeyed(perClient, maxClients), users: newKeyed(perUser, maxUsers)}
}

// attempt is one sign-in attempt holding its tokens.
type attempt struct {
	l      *limiter
	client *client
	user   *client // nil: no user named, or not one of the users
}

// begin takes a token for an attempt from client (its address) and user (the
// name of one of the users, or ""). When a bucket is empty, it returns how long
// to wait instead, and the attempt must not be checked.
func (l *limiter) begin(clientKey, user string) (*attempt, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	a := &attempt{l: l}
	var ev *client
	a.client, ev = l.clients.get(clientKey)
	l.forget(ev)
	if user != "" {
		a.user, ev = l.users.get(user)
		l.forget(ev)
	}
	var waits [3]time.Duration
	waits[0] = a.client.bucket.take(perClient, now)
	if a.user != nil {
		waits[1] = a.user.bucket.take(perUser, now)
	}
	waits[2] = l.all.take(everyone, now)
	wait := max(waits[0], waits[1], waits[2])
	if wait == 0 {
		return a, 0
	}
	// Refused: give back what was taken, so that waiting is enough.
	if waits[0] == 0 {
		a.client.bucket.refund(perClient)
	}
	if a.user != nil && waits[1] == 0 {
		a.user.bucket.refund(perUser)
	}
	if waits[2] == 0 {
		l.all.refund(everyone)
	}
	a.client.limited++
	l.report(now, a)
	return nil, wait
}

// succeeded gives the attempt's tokens back: only failures count.
func (a *attempt) succeeded() {
	l := a.l
	l.mu.Lock()
	defer l.mu.Unlock()
	a.client.bucket.refund(perClient)
	if a.user != nil {
		a.user.bucket.refund(perUser)
	}
	l.all.refund(everyone)
}

// failed records the attempt as a failure, in the log when its client's
// window allows.
func (a *attempt) failed() {
	l := a.l
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	a.client.failures++
	l.report(now, a)
}

// forget keeps the counts of an evicted client for the next line.
func (l *limiter) forget(c *client) {
	if c != nil {
		l.unlogged += c.failures
		l.unlimits += c.limited
	}
}

// report writes the line of a's client when its window allows: its first
// failure or refusal at once, then at most a line a window with the counts since its
// previous one; at most maxLogLines lines a window in all.
func (l *limiter) report(now time.Time, a *attempt) {
	c := a.client
	if !c.lastLine.IsZero() && now.Sub(c.lastLine) < logWindow {
		return
	}
	if now.Sub(l.window) >= logWindow {
		l.window, l.lines = now, 0
	}
	if l.lines >= maxLogLines {
		// Counted on the next line written, whichever client's it is.
		l.unlogged, l.unlimits, c.failures, c.limited = l.unlogged+c.failures, l.unlimits+c.limited, 0, 0
		return
	}
	l.lines++
	attrs := []any{slog.String("client", c.key), slog.Int("failures", c.failures), slog.Int("refused_429", c.limited)}
	if a.user != nil {
		attrs = append(attrs, slog.String("user", a.user.key))
	}
	if !c.lastLine.IsZero() {
		attrs = append(attrs, slog.Duration("since", now.Sub(c.lastLine)))
	}
	if l.unlogged+l.unlimits > 0 {
		attrs = append(attrs, slog.Int("other_failures", l.unlogged), slog.Int("other_refused_429", l.unlimits))
		l.unlogged, l.unlimits = 0, 0
	}
	l.log.Warn("console: sign-in refused", attrs...)
	c.failures, c.limited, c.lastLine = 0, 0, now
}

// clientKey is who a request comes from for the limits: its remote address,
// an IPv6 address's /64 (one host usually holds the whole prefix).
func clientKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "unknown"
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
