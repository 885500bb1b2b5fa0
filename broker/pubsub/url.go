package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/brokerurl"
)

// urlKind is the form of the URL.
var urlKind = brokerurl.Kind{
	Pkg: "pubsub", Schemes: []string{"pubsub"}, Form: "pubsub://<project>[/<topic>][?endpoint=host:port]",
	Credentials: "Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, the metadata server)",
}

// URL is a parsed pubsub:// URL.
type URL struct {
	// Project is the Google Cloud project ID.
	Project string
	// Topic is the topic ID template; its String is empty when the URL names
	// none.
	Topic broker.Template
	// Endpoint is the host:port of an emulator (or pstest), spoken to in
	// plaintext without credentials; empty means Google's endpoint, or
	// PUBSUB_EMULATOR_HOST when that is set (as the client library reads it).
	Endpoint string
}

// ParseURL parses pubsub://<project>[/<topic-template>][?endpoint=host:port].
// The topic template may hold placeholders such as {aggregate_type}; it may
// be empty when Config.Topic names the topic instead. The URL must not hold
// credentials: they come from Application Default Credentials only. Errors
// never quote the URL, which could hold a secret.
func ParseURL(raw string) (URL, error) {
	rest, q, err := urlKind.Name(raw, "endpoint")
	if err != nil {
		return URL{}, err
	}
	project, topic, _ := strings.Cut(rest, "/")
	if err := checkProject(project); err != nil {
		return URL{}, err
	}
	if strings.Contains(topic, "/") {
		return URL{}, errors.New("pubsub: the URL holds more path after the topic; want pubsub://<project>[/<topic>][?endpoint=host:port]")
	}
	u := URL{Project: project}
	if topic != "" {
		t, err := broker.ParseTemplate(topic)
		if err != nil {
			return URL{}, fmt.Errorf("pubsub: topic: %w", err)
		}
		if err := CheckTemplate(t); err != nil {
			return URL{}, err
		}
		u.Topic = t
	}
	if e, ok := q["endpoint"]; ok {
		if err := checkEndpoint(e); err != nil {
			return URL{}, err
		}
		u.Endpoint = e
	}
	return u, nil
}

// NewClient returns a client of u's project: for an emulator endpoint,
// plaintext without credentials; otherwise with Application Default
// Credentials (the client library honours PUBSUB_EMULATOR_HOST itself).
func (u URL) NewClient(ctx context.Context) (*pubsub.Client, error) {
	var opts []option.ClientOption
	if u.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(u.Endpoint), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled())
	}
	c, err := pubsub.NewClient(ctx, u.Project, opts...)
	if err != nil {
		return nil, fmt.Errorf("pubsub: make the client: %w", err)
	}
	return c, nil
}

// checkProject accepts project IDs (6 to 30 of a-z, 0-9 and '-') and the
// older domain-scoped ones ("example.com:project"), at most 100 bytes.
func checkProject(p string) error {
	if p == "" || len(p) > 100 {
		return errors.New("pubsub: want a project ID after pubsub:// (e.g. pubsub://my-project/outbox)")
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == ':') {
			return errors.New("pubsub: project ID: want a-z, 0-9, '-' (or a domain-scoped example.com:project)")
		}
	}
	return nil
}

// checkEndpoint accepts host:port, without scheme or credentials.
func checkEndpoint(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || strings.ContainsAny(host, "@/?#") {
		return errors.New("pubsub: endpoint: want host:port of an emulator (no scheme, no credentials)")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return errors.New("pubsub: endpoint: port must be 1 to 65535")
	}
	return nil
}
