package webhook_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Publish an event to a webhook endpoint, here an httptest server that checks the
// signature with a Verifier before handling the event.
func Example() {
	key := []byte("a secret shared with the receiver")

	received := make(chan string, 1)
	endpoint := (&webhook.Verifier{Secrets: [][]byte{key}}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			received <- fmt.Sprintf("%s %s %s seq=%s key-is-event-id=%t",
				r.Method, r.URL.Path, body, r.Header.Get(wire.HeaderAggregateSequence),
				r.Header.Get(webhook.HeaderIdempotencyKey) == r.Header.Get(wire.HeaderEventID))
			w.WriteHeader(http.StatusNoContent)
		}))
	srv := httptest.NewServer(endpoint)
	defer srv.Close()

	pub, err := webhook.New(&webhook.Config{
		URL:    srv.URL + "/events/{aggregate_type}",
		Secret: key,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	results := pub.Publish(context.Background(), []broker.Message{
		// An event as the relay reads it from the outbox: order 42, created.
		brokertest.Message("order", "42", 1),
	})
	fmt.Println("result:", results[0])
	fmt.Println(<-received)
	// Output:
	// result: <nil>
	// POST /events/order {"total":"9.50"} seq=1 key-is-event-id=true
}

// Check a request's signature on the receiving side, here while the secret is
// being rotated: requests signed with the old or the new secret are accepted.
func ExampleVerifier_Verify() {
	oldKey := []byte("the secret of last year, 32 bytes")
	newKey := []byte("the secret of this year, 32 bytes")
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	v := &webhook.Verifier{
		Secrets:   [][]byte{newKey, oldKey},
		Tolerance: 5 * time.Minute,
		Now:       func() time.Time { return now }, // omit for time.Now
	}

	// A request as the publisher sends it: wire headers, body, signature.
	body := []byte(`{"total":"9.50"}`)
	h := http.Header{}
	h.Set(wire.HeaderEventID, "01970a3c-7d2e-7c4b-9a51-2f3e4d5c6b7a")
	h.Set(wire.HeaderEventType, "created")
	h.Set(wire.HeaderAggregateType, "order")
	h.Set(wire.HeaderAggregateID, "42")
	h.Set(wire.HeaderAggregateSequence, "1")
	h.Set(wire.HeaderSchemaVersion, "1")
	h.Set(wire.HeaderOccurredAt, "2025-06-01T12:00:00Z")
	h.Set("Content-Type", "application/json")
	r := httptest.NewRequest(http.MethodPost, "/hooks/order", nil) // as a handler gets it
	r.Header = h
	h.Set(webhook.HeaderSignature, webhook.Sign(oldKey, now, r, body))

	fmt.Println("authentic:", v.Verify(r, body))
	fmt.Println("tampered body:", v.Verify(r, []byte(`{"total":"0.01"}`)))

	h.Add(wire.HeaderAggregateID, "43")
	fmt.Println("a second aggregate id:", v.Verify(r, body))
	h.Set(wire.HeaderAggregateID, "42")

	h.Set(webhook.HeaderSignature, webhook.Sign(newKey, now.Add(-time.Hour), r, body))
	fmt.Println("replayed an hour later:", v.Verify(r, body))

	h.Del(webhook.HeaderSignature)
	fmt.Println("unsigned:", v.Verify(r, body))
	// Output:
	// authentic: <nil>
	// tampered body: webhook: signature does not match
	// a second aggregate id: webhook: ambiguous request: 2 Outbox-Aggregate-Id headers
	// replayed an hour later: webhook: signature is too old: signed 1h0m0s ago, tolerance 5m0s
	// unsigned: webhook: no Outbox-Signature header
}

// Check a --broker value before starting: errors never show credentials.
func ExampleParseURL() {
	for _, raw := range []string{
		"https://hooks.example.com/outbox/{aggregate_type}",
		"https://relay:s3cret@hooks.example.com/outbox#top",
		"ftp://hooks.example.com/outbox",
	} {
		u, err := webhook.ParseURL(raw)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(u.Host, u.Path)
	}
	// Output:
	// hooks.example.com /outbox/{aggregate_type}
	// webhook: endpoint URL https://hooks.example.com: has a #fragment, which is never sent
	// webhook: endpoint URL scheme "ftp", want http or https
}

// The error of a non-2xx answer, as the relay stores it in last_error (after
// "webhook: POST event <id> to <scheme://host>: ").
func ExampleStatusError() {
	err := &webhook.StatusError{StatusCode: 422, Body: `{"error":"unknown currency"}`}
	fmt.Println(err)
	err = &webhook.StatusError{StatusCode: 503, RetryAfter: 30 * time.Second}
	fmt.Println(err)
	// Output:
	// 422 Unprocessable Entity: "{\"error\":\"unknown currency\"}"
	// 503 Service Unavailable, Retry-After 30s
}

// Sign requests the Standard Webhooks way, here for an httptest endpoint that
// checks them with a StandardVerifier; a receiver in another language uses a
// standardwebhooks library with the same "whsec_…" secret.
func ExampleStandardVerifier() {
	text := "whsec_" + "c3RhbmRhcmQgd2ViaG9va3Mga2V5LCAzMiBieXRlcy4=" // from the environment in real use
	key, err := webhook.ParseStandardSecret(text)
	if err != nil {
		log.Fatal(err)
	}
	received := make(chan string, 1)
	endpoint := (&webhook.StandardVerifier{Secrets: [][]byte{key}}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			received <- fmt.Sprintf("%s id-is-event-id=%t", body,
				r.Header.Get(webhook.HeaderWebhookID) == r.Header.Get(wire.HeaderEventID))
			w.WriteHeader(http.StatusNoContent)
		}))
	srv := httptest.NewServer(endpoint)
	defer srv.Close()

	pub, err := webhook.New(&webhook.Config{URL: srv.URL + "/events", StandardSecret: key})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	m := brokertest.Message("order", "42", 1)
	if errs := pub.Publish(context.Background(), []broker.Message{m}); errs[0] != nil {
		log.Fatal(errs[0])
	}
	fmt.Println(<-received)
	// Output: {"total":"9.50"} id-is-event-id=true
}
