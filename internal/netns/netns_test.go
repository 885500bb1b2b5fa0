package netns

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/systool"
)

// dialTimeout bounds a connection attempt over a link that should answer; over
// a cut link, the attempt must still be waiting when it ends.
const dialTimeout = 2 * time.Second

// A host reaches a server of the root namespace over its link; a cut makes the
// link a black hole (an open connection hangs, a new one times out, and no
// error is reported to either end); heal delivers what was sent meanwhile.
func TestCutIsABlackHoleAndHealDelivers(t *testing.T) {
	t.Parallel()
	h := New(t, "db", "broker")
	db, br := h.Link("db"), h.Link("broker")
	if db.RootAddr == br.RootAddr || !netip.PrefixFrom(db.RootAddr, 30).Masked().Contains(db.HostAddr) {
		t.Fatalf("links share or straddle subnets: db %s–%s, broker %s–%s", db.RootAddr, db.HostAddr, br.RootAddr, br.HostAddr)
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(db.RootAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	c, err := h.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial over the link: %v", err)
	}
	defer c.Close()
	if got := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); got != db.HostAddr {
		t.Fatalf("the connection comes from %s, want the host's end %s", got, db.HostAddr)
	}
	srv := <-accepted
	defer srv.Close()
	echo(t, c, srv, "before")

	if err := db.Cut(); err != nil {
		t.Fatal(err)
	}
	// The write succeeds (it is only queued) and nothing arrives.
	if _, err := c.Write([]byte("during\n")); err != nil {
		t.Fatalf("write during the cut reported %v; a black hole reports nothing", err)
	}
	_ = srv.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := srv.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read during the cut: %d bytes, %v; want nothing until the deadline", n, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	var timeout net.Error
	if c2, err := h.DialContext(ctx2, "tcp", ln.Addr().String()); !errors.As(err, &timeout) || !timeout.Timeout() {
		if c2 != nil {
			c2.Close()
		}
		t.Fatalf("a new connection over the cut link: %v; want it to hang until its deadline", err)
	}
	// The other link is not cut.
	bl, err := net.Listen("tcp", netip.AddrPortFrom(br.RootAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	ctx3, cancel3 := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel3()
	bc, err := h.DialContext(ctx3, "tcp", bl.Addr().String())
	if err != nil {
		t.Fatalf("the broker link, not cut, does not connect: %v", err)
	}
	bc.Close()

	if err := db.Heal(); err != nil {
		t.Fatal(err)
	}
	// TCP's retransmission delivers the write of the cut.
	_ = srv.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(srv).ReadString('\n')
	if err != nil || line != "during\n" {
		t.Fatalf("after heal the server read %q, %v; want the write made during the cut", line, err)
	}
}

// echo sends a line from c to srv and checks it arrives.
func echo(t *testing.T, c, srv net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s+"\n"); err != nil {
		t.Fatal(err)
	}
	_ = srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(srv).ReadString('\n')
	if err != nil || line != s+"\n" {
		t.Fatalf("server read %q, %v; want %q", line, err, s)
	}
}

// A command run in the host sees the host's links only.
func TestCommandRunsInsideTheHost(t *testing.T) {
	t.Parallel()
	h := New(t, "db")
	out, err := h.Command(h.ip, "-4", "-o", "addr", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), h.Link("db").HostAddr.String()+"/30") || strings.Contains(string(out), h.Link("db").RootAddr.String()+"/30") {
		t.Fatalf("inside %s, the addresses are:\n%s", h.Name, out)
	}
}

// The namespace and its veths are gone once the test that made it ends, and a
// namespace left by a killed run (its lock not held) is removed by the next New.
func TestRemovedAtCleanupAndStaleRemoved(t *testing.T) {
	ip := mustIP(t)
	var name, dev string
	t.Run("make", func(t *testing.T) {
		h := New(t, "db")
		name, dev = h.Name, h.Link("db").rootDev
	})
	if exists(t, name) {
		t.Fatalf("namespace %s outlived its test", name)
	}
	if out, err := os.ReadFile("/sys/class/net/" + dev + "/ifindex"); err == nil {
		t.Fatalf("veth %s outlived its test (ifindex %s)", dev, out)
	}
	stale := Prefix + "dead00"
	if err := run(ip, "netns", "add", stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run(ip, "netns", "delete", stale) })
	if err := cleanStale(ip); err != nil {
		t.Fatal(err)
	}
	if exists(t, stale) {
		t.Fatalf("stale namespace %s was not removed", stale)
	}
}

func mustIP(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("netns: network namespaces need root")
	}
	p, err := systool.Ensure(IPRoute2)
	if err != nil {
		t.Skip(err)
	}
	return p
}

func exists(t *testing.T, name string) bool {
	t.Helper()
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}
