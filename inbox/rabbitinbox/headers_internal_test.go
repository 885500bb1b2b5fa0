package rabbitinbox

import (
	"maps"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestDeliveryHeaders(t *testing.T) {
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.FixedZone("CET", 3600))
	got := deliveryHeaders(amqp.Table{
		"Outbox-Event-Id":      "0190a6e4-7f1c-7b2a-9c3d-1e2f3a4b5c6d",
		"raw":                  []byte("bytes"),
		"flag":                 true,
		"i8":                   int8(-8),
		"i16":                  int16(-16),
		"i32":                  int32(32),
		"i64":                  int64(-1 << 40),
		"octet":                uint8(200),
		"u16":                  uint16(65535),
		"u32":                  uint32(1 << 31),
		"f32":                  float32(0.5),
		"f64":                  1.25,
		"at":                   at,
		"price":                amqp.Decimal{Scale: 2, Value: 1250},
		"X-Request-Id":         "kept: only RabbitMQ's own x- headers go",
		"x-death":              []any{amqp.Table{"count": int64(1)}},
		"X-Delivery-Count":     int64(3),
		"x-first-death-reason": "rejected",
		"nested":               amqp.Table{"a": "b"},
		"list":                 []any{"a"},
		"void":                 nil,
	})
	want := map[string]string{
		"Outbox-Event-Id": "0190a6e4-7f1c-7b2a-9c3d-1e2f3a4b5c6d",
		"raw":             "bytes",
		"flag":            "true",
		"i8":              "-8",
		"i16":             "-16",
		"i32":             "32",
		"i64":             "-1099511627776",
		"octet":           "200",
		"u16":             "65535",
		"u32":             "2147483648",
		"f32":             "0.5",
		"f64":             "1.25",
		"at":              "2025-03-04T04:06:07Z",
		"price":           "12.50",
		"X-Request-Id":    "kept: only RabbitMQ's own x- headers go",
	}
	if !maps.Equal(got, want) {
		t.Fatalf("deliveryHeaders =\n%v\nwant\n%v", got, want)
	}
}

func TestDecimalString(t *testing.T) {
	for _, tc := range []struct {
		d    amqp.Decimal
		want string
	}{
		{amqp.Decimal{Scale: 0, Value: 42}, "42"},
		{amqp.Decimal{Scale: 2, Value: 1250}, "12.50"},
		{amqp.Decimal{Scale: 3, Value: 5}, "0.005"},
		{amqp.Decimal{Scale: 2, Value: -5}, "-0.05"},
		{amqp.Decimal{Scale: 1, Value: -2147483648}, "-214748364.8"},
		{amqp.Decimal{Scale: 12, Value: 7}, "0.000000000007"},
	} {
		if got := decimalString(tc.d); got != tc.want {
			t.Errorf("decimalString(%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestAttempt(t *testing.T) {
	for _, tc := range []struct {
		d    amqp.Delivery
		want int
	}{
		{amqp.Delivery{}, 1},
		{amqp.Delivery{Redelivered: true}, 2},
		{amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": int64(4)}}, 5},
		{amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": int32(1)}}, 2},
		{amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": "junk"}}, 2},
		{amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": int64(-1)}}, 2},
	} {
		if got := attempt(&tc.d); got != tc.want {
			t.Errorf("attempt(redelivered %v, headers %v) = %d, want %d", tc.d.Redelivered, tc.d.Headers, got, tc.want)
		}
	}
}

func TestLaneKey(t *testing.T) {
	a := laneKey(map[string]string{"Outbox-Aggregate-Type": "order", "Outbox-Aggregate-Id": "1"})
	b := laneKey(map[string]string{"outbox-aggregate-type": "order", "outbox-aggregate-id": "1"})
	c := laneKey(map[string]string{"Outbox-Aggregate-Type": "order1", "Outbox-Aggregate-Id": ""})
	if a != b || a == c {
		t.Fatalf("lane keys %v, %v, %v: want the first two equal (names compared without case), the third distinct", a, b, c)
	}
}

// FuzzParseURL: whatever the URL, neither an error nor the displayed URL shows the
// password.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"amqp://guest:guest@127.0.0.1:5672/",
		"amqps://user:p%40ss@host/vhost?heartbeat=5",
		"amqp://user:secret@host:badport/",
		"amqp://user:secret@host/?heartbeat=x",
		"amqp://user:secret@host/?unknown=1",
		"amqp:user:secret@host",
		"http://user:secret@host/",
		"amqp://user:secret@[::1/",
		"amqp://user:secret@host/%zz",
	} {
		f.Add(s)
	}
	// A password URL escaping cannot produce (it writes %XX in upper case).
	const password = "pgoutboxsecret"
	f.Fuzz(func(t *testing.T, raw string) {
		prefix, rest, ok := strings.Cut(raw, "://")
		if !ok {
			return
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if strings.ContainsAny(rest[:at], "/?#") {
				return // the authority ends before the '@': no user information
			}
			user, _, _ := strings.Cut(rest[:at], ":")
			raw = prefix + "://" + user + ":" + password + "@" + rest[at+1:]
		} else {
			raw = prefix + "://u:" + password + "@" + rest
		}
		if strings.Count(raw, password) != 1 {
			return // the password also appears elsewhere in the URL
		}
		display, err := parseURL(raw)
		if err != nil {
			if strings.Contains(err.Error(), password) {
				t.Fatalf("parseURL(%q) error shows the password: %v", raw, err)
			}
			return
		}
		if strings.Contains(display, password) {
			t.Fatalf("parseURL(%q) displays %q", raw, display)
		}
	})
}
