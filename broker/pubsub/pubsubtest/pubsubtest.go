// Package pubsubtest runs pstest, the Pub/Sub client library's in-process
// fake server, for tests: the adapter's own, the inbox subscriber's and the
// CLI's end-to-end tests. The fake listens on 127.0.0.1 and speaks gRPC, so a
// separate process (the pgoutbox binary) can publish to it too. It keeps
// everything in memory: it cannot be stopped and started again with its data.
//
// Outside the standard library (testing) it pulls in the Cloud Pub/Sub client
// and its pstest fake (cloud.google.com/go/pubsub/v2), and what the adapter
// pulls in.
package pubsubtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	pubsubbroker "github.com/pgoutbox/pgoutbox/broker/pubsub"
)

// Project is the project ID of every Server.
const Project = "pgoutbox-test"

// Server is a pstest fake and a client of it.
type Server struct {
	*pstest.Server
	// Client is a client of Project on the fake.
	Client *pubsub.Client
}

// Start starts a fake of its own on 127.0.0.1, with opts (pstest reactors,
// to inject errors), and stops it when t ends.
func Start(t testing.TB, opts ...pstest.ServerReactorOption) *Server {
	t.Helper()
	srv := pstest.NewServerWithAddress("127.0.0.1:0", opts...)
	u := pubsubbroker.URL{Project: Project, Endpoint: srv.Addr}
	client, err := u.NewClient(context.Background())
	if err != nil {
		_ = srv.Close()
		t.Fatalf("pubsubtest: %v", err)
	}
	t.Cleanup(func() {
		_ = client.Close()
		_ = srv.Close()
	})
	return &Server{Server: srv, Client: client}
}

// URL returns the pubsub:// URL of topic (a template, or "") on the fake.
func (s *Server) URL(topic string) string {
	return "pubsub://" + Project + "/" + topic + "?endpoint=" + s.Addr
}

// TopicName returns the full resource name of topic ID id.
func TopicName(id string) string { return "projects/" + Project + "/topics/" + id }

// CreateTopic creates a topic whose ID starts with prefix and returns the ID.
func (s *Server) CreateTopic(t testing.TB, prefix string) string {
	t.Helper()
	id := UniqueName(prefix)
	if _, err := s.Client.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: TopicName(id)}); err != nil {
		t.Fatalf("pubsubtest: create topic %s: %v", id, err)
	}
	return id
}

// Read returns every message published to topic ID id, in publish order
// (the fake's), as the conformance suite reads them.
func (s *Server) Read(id string) []brokertest.Stored {
	var out []brokertest.Stored
	for _, m := range s.Messages() {
		if m.Topic == TopicName(id) {
			out = append(out, brokertest.Stored{Destination: id, Key: m.OrderingKey, Headers: m.Attributes, Body: m.Data})
		}
	}
	return out
}

// UniqueName returns prefix and a random suffix, a valid topic or
// subscription ID when prefix starts with a letter.
func UniqueName(prefix string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%s-%s", prefix, hex.EncodeToString(r[:]))
}
