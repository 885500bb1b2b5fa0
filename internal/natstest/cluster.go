package natstest

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// A Cluster is a JetStream cluster of in-process NATS servers of a test's own,
// each with its store in a temporary directory. Every route between two
// servers goes through a link of the test's own (a TCP relay on 127.0.0.1),
// so that Kill can cut a server off its peers before stopping it: a crash, as
// the peers see it. Servers and links are shut down when the test ends.
type Cluster struct {
	Name    string
	servers []*server.Server
	opts    []*server.Options
	links   [][]*link // links[i][j]: server i's route to server j
}

// Timeouts of a cluster's servers.
const (
	// clusterReady bounds a server's start and the election of JetStream's
	// meta leader.
	clusterReady = 60 * time.Second
	// linkDial bounds a link's connection to the server it relays to.
	linkDial = 2 * time.Second
)

// StartCluster starts n servers forming one JetStream cluster.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := &Cluster{Name: "pgoutbox-test", links: make([][]*link, n)}
	stores := make([]string, n)
	for i := range n {
		stores[i] = tb.TempDir() // before the servers' cleanup, so removed after it
		c.links[i] = make([]*link, n)
		for j := range n {
			if i != j {
				c.links[i][j] = newLink(tb)
			}
		}
	}
	tb.Cleanup(func() {
		for _, s := range c.servers {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
		for _, row := range c.links {
			for _, l := range row {
				if l != nil {
					l.close()
				}
			}
		}
	})
	for i := range n {
		var routes []*url.URL
		for j := range n {
			if i != j {
				routes = append(routes, &url.URL{Scheme: "nats", Host: c.links[i][j].addr()})
			}
		}
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT, // then fixed: a restarted server is found where it was
			JetStream:  true,
			StoreDir:   stores[i],
			NoSigs:     true,
			NoLog:      true,
			Cluster: server.ClusterOpts{Name: c.Name, Host: "127.0.0.1", Port: server.RANDOM_PORT,
				// Peers learn of each other only through the configured links:
				// the advertised route address refuses connections, so no peer
				// opens a route around a link that Kill cuts.
				Advertise: "127.0.0.1:1"},
			Routes: routes,
		}
		srv := c.start(tb, o)
		// The server owns o now: a restart gets a copy with its ports.
		o = o.Clone()
		o.Port, o.Cluster.Port = srv.Addr().(*net.TCPAddr).Port, srv.ClusterAddr().Port
		for j := range n {
			if l := c.links[j][i]; l != nil {
				l.setTarget(srv.ClusterAddr().String())
			}
		}
		c.opts = append(c.opts, o)
		c.servers = append(c.servers, srv)
	}
	c.waitMetaLeader(tb)
	return c
}

// waitMetaLeader waits until a server leads JetStream's meta group, which
// answers the JetStream API, and knows every running server as an online
// JetStream peer: until then a stream with a replica per server cannot be
// placed ("no suitable peers for placement").
func (c *Cluster) waitMetaLeader(tb testing.TB) {
	tb.Helper()
	running := 0
	for _, s := range c.servers {
		if s != nil {
			running++
		}
	}
	wait.For(tb, clusterReady, fmt.Sprintf("a JetStream meta leader with %d peers online", running), func() bool {
		for _, s := range c.servers {
			if s != nil && s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == running {
				return true
			}
		}
		return false
	})
}

func (c *Cluster) start(tb testing.TB, o *server.Options) *server.Server {
	tb.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		tb.Fatalf("natstest: server %s: %v", o.ServerName, err)
	}
	go s.Start()
	if !s.ReadyForConnections(clusterReady) {
		tb.Fatalf("natstest: server %s not ready within %s", o.ServerName, clusterReady)
	}
	return s
}

// URL is every server's client URL, comma-separated, as nats.go takes it.
// The ports stay the same across Kill and Restart.
func (c *Cluster) URL() string {
	var urls []string
	for _, o := range c.opts {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(urls, ",")
}

// StreamLeader returns the index of the server leading stream's replicas, or -1.
func (c *Cluster) StreamLeader(stream string) int {
	for i, s := range c.servers {
		if s != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}

// Follower returns the index of a running server that is not the leader of
// stream, or -1.
func (c *Cluster) Follower(stream string) int {
	leader := c.StreamLeader(stream)
	for i, s := range c.servers {
		if s != nil && i != leader {
			return i
		}
	}
	return -1
}

// StreamCurrent reports whether every running server's replica of stream is
// current with its leader: after a Restart, a loss that leaves a quorum needs
// the restarted replica caught up first.
func (c *Cluster) StreamCurrent(stream string) bool {
	for _, s := range c.servers {
		if s != nil && !s.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return false
		}
	}
	return c.StreamLeader(stream) >= 0
}

// Restart starts again every server Kill or Stop shut down, on its ports and
// store, and waits for a meta leader.
func (c *Cluster) Restart(tb testing.TB) {
	tb.Helper()
	for i, s := range c.servers {
		if s == nil {
			c.servers[i] = c.start(tb, c.opts[i].Clone())
		}
	}
	c.waitMetaLeader(tb)
}

// Kill takes server i down as a crash or a power loss does: its routes to the
// peers are cut first, so it cannot hand its leaderships over (a server that
// shuts down steps down as raft leader first), and the peers find it gone only
// when its heartbeats stop; then the server stops and its clients lose their
// connections.
func (c *Cluster) Kill(i int) {
	for j := range c.links {
		if l := c.links[i][j]; l != nil {
			l.cut(true)
		}
		if l := c.links[j][i]; l != nil {
			l.cut(true)
		}
	}
	c.Stop(i)
	for j := range c.links {
		if l := c.links[i][j]; l != nil {
			l.cut(false)
		}
		if l := c.links[j][i]; l != nil {
			l.cut(false)
		}
	}
}

// Stop shuts server i down as SIGTERM does: it steps down from the raft
// groups it leads, handing them to a peer, then closes its connections.
func (c *Cluster) Stop(i int) {
	c.servers[i].Shutdown()
	c.servers[i].WaitForShutdown()
	c.servers[i] = nil
}

// A link relays TCP connections from its own port to target, and can be cut:
// its connections are closed and new ones refused until it is healed.
type link struct {
	ln net.Listener

	mu     sync.Mutex
	target string // "" until the server it relays to has started
	isCut  bool
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// newLink returns a link that refuses connections until setTarget.
func newLink(tb testing.TB) *link {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("natstest: link: %v", err)
	}
	l := &link{ln: ln, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l
}

func (l *link) addr() string { return l.ln.Addr().String() }

func (l *link) setTarget(target string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.target = target
}

func (l *link) accept() {
	defer l.wg.Done()
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		target := l.target
		l.mu.Unlock()
		if target == "" {
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", target, linkDial)
		if err != nil {
			in.Close()
			continue
		}
		if !l.track(in, out) {
			in.Close()
			out.Close()
			continue
		}
		l.wg.Add(2)
		go l.pipe(in, out)
		go l.pipe(out, in)
	}
}

// track records a relayed pair, unless the link is cut or closed.
func (l *link) track(a, b net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isCut || l.closed {
		return false
	}
	l.conns[a], l.conns[b] = struct{}{}, struct{}{}
	return true
}

func (l *link) pipe(dst, src net.Conn) {
	defer l.wg.Done()
	_, _ = io.Copy(dst, src) // ends with a close or a reset: the pair goes either way
	dst.Close()
	src.Close()
	l.mu.Lock()
	delete(l.conns, dst)
	delete(l.conns, src)
	l.mu.Unlock()
}

// cut closes every relayed connection and refuses new ones (on), or lets new
// ones through again (off).
func (l *link) cut(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.isCut = on
	if on {
		for c := range l.conns {
			c.Close()
		}
	}
}

func (l *link) close() {
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.ln.Close()
	l.wg.Wait()
}
