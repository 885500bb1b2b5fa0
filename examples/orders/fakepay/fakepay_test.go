package fakepay_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
	"github.com/pgoutbox/pgoutbox/examples/orders/payments"
)

var quiet = slog.New(slog.DiscardHandler)

func TestFaults(t *testing.T) {
	t.Parallel()
	faults := map[int]fakepay.Fault{1: fakepay.FaultFail, 2: fakepay.FaultTimeout}
	api := fakepay.New(&fakepay.Config{Logger: quiet, Decide: func(_ string, attempt int) fakepay.Fault { return faults[attempt] }})
	srv := httptest.NewServer(api)
	defer srv.Close()
	c := &payments.Client{BaseURL: srv.URL, HTTP: &http.Client{Timeout: 200 * time.Millisecond}}
	req := fakepay.ChargeRequest{OrderID: "o-1", AmountCents: 500}

	// 1: fails before recording anything.
	if _, err := c.Charge(context.Background(), "k", req); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("attempt 1: %v, want a 503", err)
	}
	if n := len(api.Charges()); n != 0 {
		t.Fatalf("a failed request recorded %d charges", n)
	}
	// 2: recorded, then no answer.
	if _, err := c.Charge(context.Background(), "k", req); err == nil || !strings.Contains(err.Error(), "Timeout") {
		t.Fatalf("attempt 2: %v, want a client timeout", err)
	}
	if ch := api.Charges(); len(ch) != 1 {
		t.Fatalf("a timed-out request recorded %d charges, want 1", len(ch))
	}
	// 3: the same key gets the recorded charge back.
	ch, err := c.Charge(context.Background(), "k", req)
	if err != nil || ch.ID != api.Charges()[0].ID || ch.Requests != 2 {
		t.Fatalf("attempt 3: %+v, %v", ch, err)
	}
	if st := api.Stats(); st != (fakepay.Stats{Requests: 3, Charges: 1, Replays: 1, Timeouts: 1, Failures: 1}) {
		t.Fatalf("stats %+v", st)
	}
}

func TestRatesAreValidated(t *testing.T) {
	t.Parallel()
	api := fakepay.New(nil)
	for _, r := range [][2]float64{{-0.1, 0}, {0, 1.1}, {0.6, 0.6}} {
		if api.SetFaults(r[0], r[1]) == nil {
			t.Errorf("SetFaults(%v, %v) accepted", r[0], r[1])
		}
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/faults", strings.NewReader(`{"fail_rate": 1}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /v1/faults: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, err := (&payments.Client{BaseURL: srv.URL}).Charge(context.Background(), "k", fakepay.ChargeRequest{OrderID: "o"}); err == nil {
		t.Fatal("fail_rate 1 did not fail a charge")
	}
}

// The payment API charges once per idempotency key, however often it is asked; a
// request without a key is a new charge each time.
func Example() {
	api := fakepay.New(nil)
	srv := httptest.NewServer(api)
	defer srv.Close()
	client := &payments.Client{BaseURL: srv.URL}
	ctx := context.Background()
	for range 3 {
		ch, err := client.Charge(ctx, "event-0001", fakepay.ChargeRequest{OrderID: "order-42", AmountCents: 1250})
		fmt.Println(ch.ID, ch.OrderID, ch.AmountCents, err)
	}
	naive := &payments.Client{BaseURL: srv.URL, NoIdempotencyKey: true}
	for range 2 {
		ch, _ := naive.Charge(ctx, "event-0002", fakepay.ChargeRequest{OrderID: "order-43", AmountCents: 990})
		fmt.Println(ch.ID, ch.OrderID)
	}
	fmt.Println(fakepay.ChargesPerOrder(api.Charges()))
	// Output:
	// ch_000001 order-42 1250 <nil>
	// ch_000001 order-42 1250 <nil>
	// ch_000001 order-42 1250 <nil>
	// ch_000002 order-43
	// ch_000003 order-43
	// map[order-42:1 order-43:2]
}
