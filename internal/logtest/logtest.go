// Package logtest is the log of a test: a buffer the code under test writes
// while the test reads it.
package logtest

import (
	"bytes"
	"log/slog"
	"sync"
)

// Buffer is a bytes.Buffer safe for a logger (or a process's output) and a
// reader at once. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Logger is a text logger, at slog's default level, that writes to l.
func (l *Buffer) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
