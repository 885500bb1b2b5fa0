// Package freeport hands out TCP ports of 127.0.0.1 that nothing listens on,
// for a test that starts a server (a broker, a proxy, a PostgreSQL cluster) on
// a port of its choosing, often after a client was told to dial it.
//
// The port is chosen below (or above) the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), never inside it. A port inside
// that range, even one just found free by binding port 0, can be taken before
// the server binds it: by any outgoing connection's source port, or by the
// very client that dials it (a TCP self-connect to a port nobody listens on).
// Outside the range the kernel never assigns a port on its own; the ports
// reserved for other programs (ip_local_reserved_ports) are left out too.
//
// Within a process, a port is handed out at most once. Across processes (the
// packages of one go test run are separate binaries), a random pick from the
// ~27,000 ports outside the default range plus a bind test make a clash very
// unlikely but not impossible: two processes must pick the same port, and the
// second must bind-test it before the first one's server binds it.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the lowest port handed out: below it live the well-known
// services (PostgreSQL 5432, Redis 6379, NATS 4222, …).
const lowest = 10000

// minCandidates is the fewest ports outside the ephemeral range worth picking
// from; with fewer (a machine whose range covers nearly every port), Pick
// falls back to a port the kernel chooses.
const minCandidates = 1000

var (
	mu     sync.Mutex
	handed = map[int]bool{} // every port handed out by this process
	ranges []span           // the candidate ports, once read
	total  int              // how many ports ranges holds
	read   bool
)

// span is the ports lo..hi, both included.
type span struct{ lo, hi int }

// Pick returns a port of 127.0.0.1, outside the ephemeral range, that nothing
// listened on a moment ago and that this process has not handed out before.
func Pick() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	if !read {
		ranges, total = candidates(readRange(), readReserved())
		read = true
	}
	if total < minCandidates {
		return kernelPort()
	}
	return pick()
}

// pick draws from the candidates until a port is free; mu is held.
func pick() (int, error) {
	for range 200 {
		port := nth(rand.IntN(total))
		if handed[port] || !free(port) {
			continue
		}
		handed[port] = true
		return port, nil
	}
	return 0, errors.New("freeport: no free port outside the ephemeral range after 200 tries")
}

// nth returns the i-th candidate port.
func nth(i int) int {
	for _, s := range ranges {
		if n := s.hi - s.lo + 1; i >= n {
			i -= n
			continue
		}
		return s.lo + i
	}
	panic("freeport: index out of the candidates")
}

// free reports whether port can be bound on 127.0.0.1 (and so on no
// wildcard address either) right now.
func free(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// kernelPort is the fallback: a port the kernel chooses, which may lie in the
// ephemeral range.
func kernelPort() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("freeport: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !handed[port] {
			handed[port] = true
			return port, nil
		}
	}
	return 0, errors.New("freeport: the kernel keeps choosing ports handed out already")
}

// candidates returns the ports from lowest to 65535 outside eph and the
// reserved spans, and how many they are.
func candidates(eph span, reserved []span) ([]span, int) {
	out := []span{{lowest, 65535}}
	for _, cut := range append([]span{eph}, reserved...) {
		var next []span
		for _, s := range out {
			if cut.hi < s.lo || cut.lo > s.hi {
				next = append(next, s)
				continue
			}
			if s.lo < cut.lo {
				next = append(next, span{s.lo, cut.lo - 1})
			}
			if s.hi > cut.hi {
				next = append(next, span{cut.hi + 1, s.hi})
			}
		}
		out = next
	}
	n := 0
	for _, s := range out {
		n += s.hi - s.lo + 1
	}
	return out, n
}

// readRange returns the ephemeral range; where it cannot be read (another
// system), the wider of Linux's and IANA's defaults.
func readRange() span {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			lo, err1 := strconv.Atoi(f[0])
			hi, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && lo <= hi {
				return span{lo, hi}
			}
		}
	}
	return span{32768, 65535}
}

// readReserved returns the ports reserved for other programs
// ("8080,9000-9100"); none where it cannot be read.
func readReserved() []span {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_reserved_ports")
	if err != nil {
		return nil
	}
	return parseSpans(string(b))
}

func parseSpans(s string) []span {
	var out []span
	for _, item := range strings.Split(strings.TrimSpace(s), ",") {
		a, b, isRange := strings.Cut(strings.TrimSpace(item), "-")
		lo, err := strconv.Atoi(a)
		if err != nil {
			continue
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(b); err != nil || hi < lo {
				continue
			}
		}
		out = append(out, span{lo, hi})
	}
	return out
}
