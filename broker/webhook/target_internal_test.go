package webhook

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
)

// Distinct (aggregate type, event type) pairs never share an endpoint URL: path
// escaping keeps '/' apart, and a value holding the character that separates it
// from the next placeholder ('-' here) is refused.
func TestTargetIsInjective(t *testing.T) {
	values := []string{"a", "b", "c", "a-b", "b-c", "a/b", "b/c", "a.b", "..", ".", "a b", "ä", "a%2Fb", "a?b", "a#b", "-", "a--b"}
	for _, raw := range []string{
		"https://h/hooks/{aggregate_type}/{event_type}",
		"https://h/hooks/{aggregate_type}-{event_type}",
		"https://h/{aggregate_type}.{event_type}/x",
	} {
		e, err := parseEndpoint(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		seen := map[string][2]string{}
		refused := 0
		for _, at := range values {
			for _, et := range values {
				m := brokertest.Message(at, "1", 1)
				m.EventType = et
				got, err := e.target(&m)
				if err != nil {
					refused++
					continue
				}
				if prev, ok := seen[got]; ok && prev != [2]string{at, et} {
					t.Fatalf("%s: %q and %q both post to %s", raw, prev, [2]string{at, et}, got)
				}
				seen[got] = [2]string{at, et}
			}
		}
		t.Logf("%s: %d URLs, %d refused", raw, len(seen), refused)
	}
	e, _ := parseEndpoint("https://h/hooks/{aggregate_type}-{event_type}")
	m := brokertest.Message("a-b", "1", 1)
	m.EventType = "c"
	if _, err := e.target(&m); !errors.Is(err, broker.ErrAmbiguousDestination) {
		t.Fatalf("a-b/c: %v, want ErrAmbiguousDestination", err)
	}
}

// A tenant name in the path is one escaped segment: whatever the name (a
// schema name is anyone's choice who may create a schema), the request goes
// to the configured scheme, host and port, under the path's fixed prefix,
// and names that would move up the path are refused.
func TestTargetTenantStaysInItsSegment(t *testing.T) {
	e, err := parseEndpoint("https://hooks.example:8443/in/{tenant}/{aggregate_type}?sig=1")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, tenant := range []string{"t_1", "T-9", "a/b", "../admin", "..%2fadmin", "%2e%2e", "a?x=1", "a#f", "@evil.example", "//evil.example",
		`\evil.example`, "evil.example:80", "a b", "ä", "a\nb", "a\x00", "https://evil.example/", "a;b", "~", "%", "%zz"} {
		m := brokertest.Message("order", "1", 1)
		m.Tenant = tenant
		got, err := e.target(&m)
		if err != nil {
			t.Fatalf("tenant %q: %v", tenant, err)
		}
		u, err := url.Parse(got)
		if err != nil || u.Scheme != "https" || u.Host != "hooks.example:8443" || u.RawQuery != "sig=1" || u.Fragment != "" {
			t.Fatalf("tenant %q: %s leaves the endpoint (%v)", tenant, got, err)
		}
		segs := strings.Split(u.EscapedPath(), "/")
		if len(segs) != 4 || segs[1] != "in" || segs[3] != "order" {
			t.Fatalf("tenant %q: path %s is not /in/<tenant>/order", tenant, u.EscapedPath())
		}
		if back, _ := url.PathUnescape(segs[2]); back != tenant {
			t.Fatalf("tenant %q: segment %s reads back as %q", tenant, segs[2], back)
		}
		if prev, ok := seen[got]; ok {
			t.Fatalf("tenants %q and %q both post to %s", prev, tenant, got)
		}
		seen[got] = tenant
	}
	for _, tenant := range []string{"", ".", ".."} {
		m := brokertest.Message("order", "1", 1)
		m.Tenant = tenant
		if got, err := e.target(&m); err == nil {
			t.Errorf("tenant %q: posts to %s, want it refused", tenant, got)
		}
	}
}
