// Package netns gives a test "hosts" of its own: Linux network namespaces, each
// joined to the root namespace by veth links, so that a process run inside one
// reaches the test's servers only over those links, and the test can cut a link
// as a network partition would: packets vanish, nothing answers, nothing is
// refused. It is for tests only, and needs root (the tests skip without it).
//
// Every link is a /30 of its own, taken from a private range that overlaps no
// address or route of the machine (checked under a machine-wide lock, so that
// parallel tests and test processes never collide). Nothing but these veths is
// ever addressed or cut.
//
// A cut is a black hole made with the ip tool alone: each end's neighbour entry
// for the other end is pointed at a hardware address no one has, so every frame
// is dropped by the receiving veth (it is not addressed to it) while the sender
// sees no error. TCP retransmits into the void; new connections time out. Heal
// restores the true addresses, and retransmissions get through again. (The
// qdisc netem, the usual tool, is not built into every kernel; this needs none.)
//
// Namespaces are named with Prefix and removed when the test ends, also when it
// fails. Each is guarded by a lock file its process holds while it lives: a
// namespace whose lock is free was left by a killed run and is removed by the
// next New.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pgoutbox/pgoutbox/internal/systool"
)

// Prefix begins the name of every namespace and root-side veth this package makes.
const Prefix = "pgo-"

// cutMAC is the hardware address a cut link's neighbour entries point at: a
// locally administered address no interface has.
const cutMAC = "02:70:67:6f:ff:ff"

// pool is the private range the links' /30 subnets are taken from; a /30 that
// overlaps any address or route of the machine is skipped.
var pool = netip.MustParsePrefix("10.250.0.0/16")

// lockDir holds one lock file per live namespace, and allocLock, which
// serialises the choice of subnets across processes. A fixed path, beside
// ip's own /run/netns: every test process on the machine, whatever its TMPDIR,
// must find the locks of the others (a namespace without one is removed as
// stale).
var (
	lockDir   = "/run/pgoutbox-netns"
	allocLock = filepath.Join(lockDir, "alloc.lock")
)

// IPRoute2 is the ip tool's Debian package.
var IPRoute2 = systool.Tool{Program: "ip", Package: "iproute2"}

// Host is a network namespace standing for a machine of its own.
type Host struct {
	// Name is the namespace's name (Prefix and a random suffix).
	Name string

	ip    string
	links map[string]*Link
	lock  *os.File
}

// Link is a veth pair between a Host and the root namespace, a /30 of its own.
type Link struct {
	// Role names the link within its host, e.g. "db"; it is also the device's
	// name inside the namespace.
	Role string
	// RootAddr is the root namespace's end, where a server in the root
	// namespace is reached from the host; HostAddr is the host's end.
	RootAddr, HostAddr netip.Addr

	host             *Host
	rootDev          string
	rootMAC, hostMAC string
}

var cleanOnce sync.Once

// New makes a host with one link per role (e.g. "db", "broker"), removed when the
// test ends. It skips the test, naming the reason, when the process is not root
// or the machine cannot make namespaces; it fails the test on any other error.
func New(tb testing.TB, roles ...string) *Host {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("netns: network namespaces need root; run the test as root (CI does)")
	}
	ipPath, err := systool.Ensure(IPRoute2)
	if err != nil {
		tb.Skipf("netns: no ip tool: %v", err)
	}
	cleanOnce.Do(func() {
		if err := cleanStale(ipPath); err != nil {
			tb.Logf("netns: removing namespaces of killed runs: %v", err)
		}
	})
	h := &Host{ip: ipPath, links: map[string]*Link{}}
	if err := h.create(); err != nil {
		h.remove()
		tb.Skipf("netns: this machine cannot make a network namespace: %v", err)
	}
	tb.Cleanup(h.remove)
	if err := h.addLinks(roles); err != nil {
		tb.Fatalf("netns: %s: %v", h.Name, err)
	}
	return h
}

// create takes the namespace's lock and makes the namespace with its loopback up.
func (h *Host) create() error {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return fmt.Errorf("lock directory: %w", err)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	h.Name = Prefix + hex.EncodeToString(b)
	f, err := os.OpenFile(filepath.Join(lockDir, h.Name), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	h.lock = f
	if err := h.run("netns", "add", h.Name); err != nil {
		return err
	}
	if err := h.run("-n", h.Name, "link", "set", "lo", "up"); err != nil {
		return err
	}
	// ip netns exec also needs a mount namespace of its own (for /sys): a
	// container may allow the one and not the other.
	if out, err := h.Command("true").CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns exec %s true: %w: %s", h.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// addLinks chooses the links' subnets and makes them, under the machine-wide
// allocation lock: the subnets are free when chosen and taken when it is released.
func (h *Host) addLinks(roles []string) error {
	unlock, err := flock(allocLock)
	if err != nil {
		return err
	}
	defer unlock()
	used, err := usedPrefixes(h.ip)
	if err != nil {
		return err
	}
	for i, role := range roles {
		if _, dup := h.links[role]; dup || role == "" || len(role) > 15 || role == "lo" {
			return fmt.Errorf("link role %q: want a unique device name of at most 15 characters", role)
		}
		subnet, err := freeSubnet(used)
		if err != nil {
			return err
		}
		used = append(used, subnet)
		l := &Link{Role: role, host: h, rootDev: fmt.Sprintf("%s-%d", h.Name, i)}
		l.RootAddr = subnet.Addr().Next()
		l.HostAddr = l.RootAddr.Next()
		l.rootMAC, l.hostMAC = macOf(l.RootAddr), macOf(l.HostAddr)
		if err := l.create(); err != nil {
			return fmt.Errorf("link %s: %w", role, err)
		}
		h.links[role] = l
	}
	return nil
}

func (l *Link) create() error {
	h := l.host
	bits := "/30"
	steps := [][]string{
		{"link", "add", l.rootDev, "address", l.rootMAC, "type", "veth",
			"peer", "name", l.Role, "address", l.hostMAC, "netns", h.Name},
		{"addr", "add", l.RootAddr.String() + bits, "dev", l.rootDev},
		{"link", "set", l.rootDev, "up"},
		{"-n", h.Name, "addr", "add", l.HostAddr.String() + bits, "dev", l.Role},
		{"-n", h.Name, "link", "set", l.Role, "up"},
	}
	for _, s := range steps {
		if err := h.run(s...); err != nil {
			return err
		}
	}
	// Permanent neighbour entries: no ARP on these links, so that Cut and Heal
	// are the only thing that decides where frames go.
	return l.point(l.hostMAC, l.rootMAC)
}

// point sets the neighbour entries of both ends: the root's entry for the
// host's address, and the host's entry for the root's address.
func (l *Link) point(toHost, toRoot string) error {
	h := l.host
	return errors.Join(
		h.run("neigh", "replace", l.HostAddr.String(), "lladdr", toHost, "dev", l.rootDev, "nud", "permanent"),
		h.run("-n", h.Name, "neigh", "replace", l.RootAddr.String(), "lladdr", toRoot, "dev", l.Role, "nud", "permanent"))
}

// Link returns the host's link of the given role; it panics on an unknown role
// (a mistake in the test).
func (h *Host) Link(role string) *Link {
	l, ok := h.links[role]
	if !ok {
		panic(fmt.Sprintf("netns: host %s has no link %q", h.Name, role))
	}
	return l
}

// Cut makes the link a black hole in both directions: every packet is silently
// dropped, as in a network partition. Connections over it stay open and hang.
func (l *Link) Cut() error {
	if err := l.point(cutMAC, cutMAC); err != nil {
		return fmt.Errorf("netns: cut %s/%s: %w", l.host.Name, l.Role, err)
	}
	return nil
}

// Heal undoes Cut: packets flow again, and TCP's retransmissions deliver what
// was sent meanwhile to connections that are still open.
func (l *Link) Heal() error {
	if err := l.point(l.hostMAC, l.rootMAC); err != nil {
		return fmt.Errorf("netns: heal %s/%s: %w", l.host.Name, l.Role, err)
	}
	return nil
}

// Command returns a command that runs name with args inside the host
// (`ip netns exec`, which execs the program: its pid is the program's).
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command(h.ip, append([]string{"netns", "exec", h.Name, name}, args...)...)
}

// DialContext connects from inside the host, as a process there would: the
// socket is made in the host's namespace (by a thread that enters it for that
// one call), and stays there.
func (h *Host) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread enters the namespace; if it cannot get back, it stays
		// locked and ends with this goroutine instead of serving others.
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("netns: own namespace: %w", err)}
			return
		}
		defer orig.Close()
		target, err := os.Open(filepath.Join("/run/netns", h.Name))
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("netns: %s: %w", h.Name, err)}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("netns: enter %s: %w", h.Name, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, address)
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// remove deletes the namespace (its veths go with it) and its lock file.
func (h *Host) remove() {
	if h.Name != "" {
		_ = h.run("netns", "delete", h.Name)
		for _, l := range h.links {
			_ = h.run("link", "delete", l.rootDev) // gone with its peer, normally
		}
	}
	if h.lock != nil {
		_ = os.Remove(h.lock.Name())
		h.lock.Close()
	}
}

func (h *Host) run(args ...string) error { return run(h.ip, args...) }

func run(ip string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(ip, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// cleanStale removes the namespaces (and root-side veths) of runs that were
// killed: those whose lock file is missing or not held.
func cleanStale(ip string) error {
	out, err := exec.Command(ip, "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	var errs []error
	live := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], Prefix) {
			continue
		}
		name := f[0]
		if held(name) {
			live[name] = true
			continue
		}
		if err := run(ip, "netns", "delete", name); err != nil {
			errs = append(errs, err)
		}
		_ = os.Remove(filepath.Join(lockDir, name))
	}
	links, err := exec.Command(ip, "-o", "link", "show").Output()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("ip link show: %w", err))...)
	}
	for _, line := range strings.Split(string(links), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[1], Prefix) {
			continue
		}
		dev, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		ns := dev[:strings.LastIndex(dev, "-")]
		if !live[ns] && !held(ns) {
			if err := run(ip, "link", "delete", dev); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// held reports whether a live process holds the namespace's lock.
func held(name string) bool {
	f, err := os.OpenFile(filepath.Join(lockDir, name), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

func flock(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("netns: allocation lock: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("netns: allocation lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("netns: allocation lock: %w", err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// usedPrefixes lists every IPv4 address and route of the root namespace, in
// every routing table, but the default route.
func usedPrefixes(ip string) ([]netip.Prefix, error) {
	var used []netip.Prefix
	for _, args := range [][]string{{"-4", "-o", "addr", "show"}, {"-4", "route", "show", "table", "all"}} {
		out, err := exec.Command(ip, args...).Output()
		if err != nil {
			return nil, fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if p, ok := prefixOf(strings.Fields(line)); ok {
				used = append(used, p)
			}
		}
	}
	return used, nil
}

// routeTypes are the words that may come before a route's destination.
var routeTypes = map[string]bool{"unicast": true, "local": true, "broadcast": true, "multicast": true,
	"unreachable": true, "blackhole": true, "prohibit": true, "throw": true, "nat": true, "anycast": true}

// prefixOf finds the prefix in a line of `ip -o addr` (after "inet") or of
// `ip route` (its destination); the default route counts as none.
func prefixOf(f []string) (netip.Prefix, bool) {
	s := ""
	for i, w := range f {
		if w == "inet" && i+1 < len(f) {
			s = f[i+1]
		}
	}
	if s == "" && len(f) > 0 {
		s = f[0]
		if routeTypes[s] && len(f) > 1 {
			s = f[1]
		}
	}
	if s == "" || s == "default" {
		return netip.Prefix{}, false
	}
	if !strings.Contains(s, "/") {
		s += "/32"
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}

// freeSubnet returns the first /30 of pool that overlaps nothing in used.
func freeSubnet(used []netip.Prefix) (netip.Prefix, error) {
	for a := pool.Addr(); pool.Contains(a); {
		p := netip.PrefixFrom(a, 30)
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p, nil
		}
		for range 4 {
			a = a.Next()
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /30 left in %s", pool)
}

// macOf is a locally administered hardware address derived from addr, unique
// among the links.
func macOf(addr netip.Addr) string {
	b := addr.As4()
	return fmt.Sprintf("02:70:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
}
