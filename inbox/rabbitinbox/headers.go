package rabbitinbox

import (
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/wire"
)

// brokerHeaders are headers RabbitMQ itself adds to a message (dead-lettering,
// quorum queue redeliveries, shovels and federation), lower-cased. They describe
// the message's journey, not the event, so they are not passed on as the producer's
// headers. Producer headers starting with "x-" are kept: only these names are
// dropped.
var brokerHeaders = map[string]bool{
	"x-death":                true,
	"x-delivery-count":       true,
	"x-first-death-exchange": true,
	"x-first-death-queue":    true,
	"x-first-death-reason":   true,
	"x-last-death-exchange":  true,
	"x-last-death-queue":     true,
	"x-last-death-reason":    true,
	"x-received-from":        true,
	"x-shovelled":            true,
	"x-shovelled-timestamp":  true,
}

// deliveryHeaders converts an AMQP headers table to the string headers of an
// inbox.Delivery. The relay publishes every header as a string (broker/rabbitmq);
// other scalar types, which a producer outside pgoutbox or a plugin may set, are
// converted by headerString. Values without a string form (nested tables, arrays,
// void) and RabbitMQ's own headers are left out.
func deliveryHeaders(t amqp.Table) map[string]string {
	h := make(map[string]string, len(t))
	for k, v := range t {
		if brokerHeaders[strings.ToLower(k)] {
			continue
		}
		if s, ok := headerString(v); ok {
			h[k] = s
		}
	}
	return h
}

// headerString returns the string form of one AMQP field value: strings and byte
// arrays as they are, numbers in decimal, booleans as "true"/"false", timestamps
// in RFC 3339. It reports false for values that have none.
func headerString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case bool:
		return strconv.FormatBool(v), true
	case int8:
		return strconv.FormatInt(int64(v), 10), true
	case int16:
		return strconv.FormatInt(int64(v), 10), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.Itoa(v), true
	case uint8:
		return strconv.FormatUint(uint64(v), 10), true
	case uint16:
		return strconv.FormatUint(uint64(v), 10), true
	case uint32:
		return strconv.FormatUint(uint64(v), 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano), true
	case amqp.Decimal:
		return decimalString(v), true
	}
	return "", false
}

// decimalString writes an AMQP decimal (Value × 10^-Scale) exactly, without going
// through a float.
func decimalString(d amqp.Decimal) string {
	digits := strconv.FormatInt(int64(d.Value), 10)
	sign := ""
	if d.Value < 0 {
		sign, digits = "-", digits[1:]
	}
	scale := int(d.Scale)
	if scale == 0 {
		return sign + digits
	}
	if len(digits) <= scale {
		digits = strings.Repeat("0", scale-len(digits)+1) + digits
	}
	return sign + digits[:len(digits)-scale] + "." + digits[len(digits)-scale:]
}

// header looks name up exactly, then without regard to case, as inbox.Decode does.
func header(h map[string]string, name string) string {
	if v, ok := h[name]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// laneKey names the aggregate a message belongs to (in either wire format): its
// messages are processed one at a time. Messages without the headers (not outbox events) share one lane; they
// are rejected quickly.
func laneKey(h map[string]string) pgoutbox.Lane {
	return pgoutbox.LaneOf(wire.LaneHeaders(func(name string) string { return header(h, name) }))
}

// attempt is the delivery count of d, for the inbox's retry backoff. Quorum queues
// count deliveries in x-delivery-count (earlier deliveries, absent on the first);
// classic queues only say whether the message was delivered before.
func attempt(d *amqp.Delivery) int {
	for k, v := range d.Headers {
		if !strings.EqualFold(k, "x-delivery-count") {
			continue
		}
		if s, ok := headerString(v); ok {
			if n, err := strconv.ParseInt(s, 10, 32); err == nil && n >= 0 && n < 1<<30 {
				return int(n) + 1
			}
		}
	}
	if d.Redelivered {
		return 2
	}
	return 1
}
