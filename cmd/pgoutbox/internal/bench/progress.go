package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/redact"
)

// progress shows what runs: one line redrawn in place on a terminal, else a line
// every few seconds (and on every change of step), so logs stay readable.
type progress struct {
	w       io.Writer
	tty     bool
	mu      sync.Mutex
	last    time.Time
	width   int
	secrets []string // hidden from every line (the lines name brokers by URL)
}

func newProgress(w io.Writer, tty bool) *progress { return &progress{w: w, tty: tty} }

// step announces a new phase; update reports within it.
func (p *progress) step(format string, args ...any) { p.show(true, format, args...) }

func (p *progress) update(format string, args ...any) { p.show(false, format, args...) }

func (p *progress) show(force bool, format string, args ...any) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	line := redact.Text(fmt.Sprintf(format, args...), p.secrets...)
	now := time.Now()
	if p.tty {
		if !force && now.Sub(p.last) < 100*time.Millisecond {
			return
		}
		pad := ""
		if n := p.width - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		fmt.Fprintf(p.w, "\r%s%s", line, pad)
		p.width = len(line)
		p.last = now
		return
	}
	if !force && now.Sub(p.last) < 5*time.Second {
		return
	}
	fmt.Fprintf(p.w, "bench: %s\n", line)
	p.last = now
}

// done ends the in-place line.
func (p *progress) done() {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.width > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
		p.width = 0
	}
}

func round2(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return math.Round(f*100) / 100
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return math.Round(a/b*1000) / 1000
}
