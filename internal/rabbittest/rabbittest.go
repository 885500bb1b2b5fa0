// Package rabbittest gives a test an exchange and a queue of its own on the
// test RabbitMQ server (Queue, Drain), and drives the server's administration tool,
// rabbitmqctl, as an operator would, for tests of what a client does when the
// server acts on its connection.
package rabbittest

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Ctl is the rabbitmqctl of the test server.
type Ctl struct{ path string }

// NewCtl finds rabbitmqctl; the test is skipped where it is not installed.
func NewCtl(tb testing.TB) *Ctl {
	tb.Helper()
	path, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		tb.Skip("rabbitmqctl not found")
	}
	return &Ctl{path: path}
}

// run runs rabbitmqctl with args, with a minute of its own: rabbitmqctl starts
// slowly on a busy box.
func (c *Ctl) run(tb testing.TB, args ...string) []byte {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.path, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("rabbitmqctl %s: %v: %s", args[0], err, out)
	}
	return out
}

// ConnectionPID finds the server's pid of the connection named name (the
// connection_name client property).
func (c *Ctl) ConnectionPID(tb testing.TB, name string) string {
	tb.Helper()
	out := c.run(tb, "list_connections", "--quiet", "--no-table-headers", "pid", "client_properties")
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		pid, props, ok := strings.Cut(sc.Text(), "\t")
		if ok && strings.Contains(props, `{"connection_name","`+name+`"}`) {
			return pid
		}
	}
	tb.Fatalf("no RabbitMQ connection named %s in:\n%s", name, out)
	return ""
}

// CloseConnection has the server close the connection pid, giving the client
// reason, as an operator or a node shutting down would.
func (c *Ctl) CloseConnection(tb testing.TB, pid, reason string) {
	tb.Helper()
	c.run(tb, "close_connection", pid, reason)
}
