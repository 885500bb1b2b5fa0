package freeport

import (
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
)

func TestCandidates(t *testing.T) {
	got, n := candidates(span{32768, 60999}, parseSpans("8080, 20000-20009,bad,9-1\n"))
	want := []span{{10000, 19999}, {20010, 32767}, {61000, 65535}}
	if !slices.Equal(got, want) || n != 10000+12758+4536 {
		t.Errorf("candidates = %v (%d), want %v", got, n, want)
	}
	if _, n := candidates(span{1024, 65535}, nil); n != 0 {
		t.Errorf("a range covering every port leaves %d candidates", n)
	}
}

// Every port handed out lies outside the ephemeral range, is bindable, and
// is handed out once, even to concurrent callers.
func TestPickOutsideTheEphemeralRange(t *testing.T) {
	eph := readRange()
	var mu sync.Mutex
	seen := map[int]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				p, err := Pick()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[p] {
					t.Errorf("port %d handed out twice", p)
				}
				seen[p] = true
				mu.Unlock()
				if total >= minCandidates && (p >= eph.lo && p <= eph.hi || p < lowest) {
					t.Errorf("port %d: inside the ephemeral range %v or below %d", p, eph, lowest)
				}
			}
		})
	}
	wg.Wait()
	p, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		t.Fatalf("the port handed out cannot be bound: %v", err)
	}
	_ = l.Close()
}

// A port something listens on is never handed out.
func TestPickSkipsPortsInUse(t *testing.T) {
	mu.Lock()
	defer mu.Unlock()
	// Two adjacent ports not handed out, the first held by this test's listener.
	var busy net.Listener
	base := 0
	for p := 20000; p < 30000 && busy == nil; p += 2 {
		if handed[p] || handed[p+1] {
			continue
		}
		l1, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		if l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1)); err != nil {
			_ = l1.Close()
			continue
		} else {
			_ = l2.Close()
		}
		busy, base = l1, p
	}
	if busy == nil {
		t.Fatal("no two adjacent free ports")
	}
	defer busy.Close()

	saved, savedTotal := ranges, total
	defer func() { ranges, total = saved, savedTotal }()
	ranges, total = []span{{base, base + 1}}, 2
	got, err := pick()
	if err != nil || got != base+1 {
		t.Errorf("pick = %d, %v; want %d (%d is in use)", got, err, base+1, base)
	}
	// Both now unavailable: the one in use, the one handed out.
	if got, err := pick(); err == nil {
		t.Errorf("pick = %d, want an error: no candidate left", got)
	}
}
