package natstest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// A Cluster is a JetStream cluster of in-process NATS servers of a test's own,
// each with its store in a temporary directory, routes between them on
// 127.0.0.1. Servers are shut down when the test ends.
type Cluster struct {
	Name    string
	servers []*server.Server
	opts    []*server.Options
}

// clusterReady bounds a cluster's start: every server ready for connections
// and JetStream's meta leader elected.
const clusterReady = 60 * time.Second

// StartCluster starts n servers forming one JetStream cluster.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := &Cluster{Name: "pgoutbox-test"}
	ports, clientPorts := make([]int, n), make([]int, n)
	for i := range ports {
		ports[i], clientPorts[i] = freePort(tb), freePort(tb)
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	for i := range n {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       clientPorts[i], // fixed: a restarted node is found where it was
			JetStream:  true,
			StoreDir:   tb.TempDir(),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: c.Name, Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		}
		c.opts = append(c.opts, o)
		c.servers = append(c.servers, c.start(tb, o))
	}
	tb.Cleanup(func() {
		for _, s := range c.servers {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
	})
	c.waitMetaLeader(tb)
	return c
}

// waitMetaLeader waits until a server leads JetStream's meta group, which
// answers the JetStream API.
func (c *Cluster) waitMetaLeader(tb testing.TB) {
	tb.Helper()
	wait.For(tb, clusterReady, "a JetStream meta leader", func() bool {
		for _, s := range c.servers {
			if s != nil && s.JetStreamIsLeader() {
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

// URL is every running server's client URL, comma-separated, as nats.go takes it.
func (c *Cluster) URL() string {
	var urls []string
	for _, s := range c.servers {
		if s != nil {
			urls = append(urls, s.ClientURL())
		}
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

// Restart starts again every server Kill shut down, on its ports and store.
func (c *Cluster) Restart(tb testing.TB) {
	tb.Helper()
	for i, s := range c.servers {
		if s == nil {
			c.servers[i] = c.start(tb, c.opts[i].Clone())
		}
	}
	c.waitMetaLeader(tb)
}

// Kill shuts server i down, as a node loss.
func (c *Cluster) Kill(i int) {
	c.servers[i].Shutdown()
	c.servers[i].WaitForShutdown()
	c.servers[i] = nil
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("natstest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
