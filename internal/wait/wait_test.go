package wait_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/wait"
)

func TestUntil(t *testing.T) {
	var n atomic.Int32
	if !wait.Until(5*time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("a condition that comes true was reported false")
	}
	if wait.Until(30*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported true")
	}
}
