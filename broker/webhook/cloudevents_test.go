package webhook_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/cetest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat posts in the CloudEvents format and decodes the
// request with the CloudEvents Go SDK's HTTP protocol binding (ce-* headers,
// Content-Type). The signature covers the ce-* attributes in place of the
// Outbox-* headers: a request whose ce-id was changed is refused.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	type seen struct {
		header http.Header
		body   []byte
		uri    string
	}
	got := make(chan seen, 1)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Clone(), body, r.URL.RequestURI()}
	}))
	const source = "/pgoutbox/app"
	p := newPublisher(t, webhook.Config{
		URL:      srv.URL() + "/hooks",
		Encoding: wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: source},
	})
	if _, err := webhook.New(&webhook.Config{URL: srv.URL(), Secret: secret, Header: http.Header{"Ce-Source": {"/x"}},
		Encoding: wire.Encoding{Format: wire.FormatCloudEvents}}); err == nil {
		t.Error("Config.Header Ce-Source accepted in the CloudEvents format")
	}
	if _, err := webhook.New(&webhook.Config{URL: srv.URL(), Secret: secret,
		Encoding: wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "not a uri"}}); err == nil {
		t.Error("a source with spaces accepted")
	}
	spoofed := message("order", "order-spoof", 1)
	spoofed.Headers["Ce-Type"] = "forged"
	if err := publish(t, p, spoofed)[0]; !broker.IsPermanent(err) {
		t.Fatalf("a producer header Ce-Type: %v, want a permanent refusal", err)
	}
	m := message("order", "order-42", 7)
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	r := <-got
	for k := range r.header {
		if strings.HasPrefix(k, "Outbox-") && k != webhook.HeaderSignature {
			t.Errorf("header %s in the CloudEvents format", k)
		}
	}
	if r.header.Get("Tenant") != m.Headers["Tenant"] || r.header.Get("traceparent") != m.Headers["traceparent"] {
		t.Errorf("producer headers %v not carried as in the default format", r.header)
	}
	v := &webhook.Verifier{Secrets: [][]byte{secret}}
	if err := v.Verify(request(r.header, r.uri), r.body); err != nil {
		t.Errorf("Verify: %v", err)
	}
	relabelled := r.header.Clone()
	relabelled.Set("Ce-Id", "01a241ce-0000-7000-8000-000000000000")
	if err := v.Verify(request(relabelled, r.uri), r.body); !errors.Is(err, webhook.ErrBadSignature) {
		t.Errorf("Verify with another ce-id: %v, want ErrBadSignature", err)
	}
	// What v1 left unsigned: the source, the subject, the content type, the path.
	for name, change := range map[string]func(http.Header) string{
		"Ce-Source":    func(h http.Header) string { h.Set("Ce-Source", "/forged"); return r.uri },
		"Ce-Subject":   func(h http.Header) string { h.Set("Ce-Subject", "order/other"); return r.uri },
		"Content-Type": func(h http.Header) string { h.Set("Content-Type", "text/plain"); return r.uri },
		"path":         func(http.Header) string { return "/other-tenant/hooks" },
	} {
		h := r.header.Clone()
		if err := v.Verify(request(h, change(h)), r.body); !errors.Is(err, webhook.ErrBadSignature) {
			t.Errorf("Verify with another %s: %v, want ErrBadSignature", name, err)
		}
	}
	// A second value of any attribute, or of the content type or the key.
	for _, name := range []string{"Ce-Specversion", "Ce-Id", "Ce-Source", "Ce-Type", "Ce-Subject", "Ce-Time",
		"Ce-Pgoutboxaggtype", "Ce-Pgoutboxaggid", "Ce-Pgoutboxseq", "Ce-Pgoutboxschemaver", "Content-Type", "Idempotency-Key"} {
		h := r.header.Clone()
		h[name] = append([]string{"forged"}, h[name]...)
		if err := v.Verify(request(h, r.uri), r.body); !errors.Is(err, webhook.ErrAmbiguousRequest) {
			t.Errorf("a second %s: Verify = %v, want ErrAmbiguousRequest", name, err)
		}
	}

	req, err := http.NewRequest(http.MethodPost, "/hooks", bytes.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = r.header
	ev := cetest.Decode(t, cehttp.NewMessageFromHttpRequest(req))
	t.Logf("webhook (HTTP), SDK decoded: %s", cetest.Check(t, ev, &m, source))
}
