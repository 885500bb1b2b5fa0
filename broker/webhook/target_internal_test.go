package webhook

import (
	"errors"
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
