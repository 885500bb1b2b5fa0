package sqsinbox_test

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Whatever arrives on the queue is untrusted. Messages that imitate an outbox
// event badly are deleted as undecodable (never applied, never redelivered
// forever), each in a group of its own, and the real event behind them is
// applied.
func TestHostileMessages(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	valid := inboxtest.Event("x0", 1)
	base := func() map[string]string { return maps.Clone(valid.WireHeaders()) }
	variants := map[string]struct {
		body  string
		attrs map[string]string
	}{
		"headers attribute not JSON":    {`{}`, with(base(), sqs.HeadersAttribute, `{"tenant":`)},
		"headers attribute not strings": {`{}`, with(base(), sqs.HeadersAttribute, `{"tenant":["eu"]}`)},
		"nil event id":                  {`{}`, with(base(), wire.HeaderEventID, "00000000-0000-0000-0000-000000000000")},
		"sequence above the maximum":    {`{}`, with(base(), wire.HeaderAggregateSequence, "9223372036854775807")},
		"sequence not a number":         {`{}`, with(base(), wire.HeaderAggregateSequence, "1; DROP TABLE effects")},
		"body not JSON":                 {`not json`, base()},
		"no attributes":                 {`{"order_id":"x0"}`, nil},
		"a CloudEvent with a forged id": {ce(valid, `"id":"1"`), ceAttrs(nil)},
		"a CloudEvent with data twice":  {ce(valid, `"data_base64":"e30="`), ceAttrs(nil)},
		"a CloudEvent with a number":    {ce(valid, `"`+wire.CEExtSequence+`":1`), ceAttrs(nil)},
		"a CloudEvent not JSON":         {`{"specversion":`, ceAttrs(nil)},
		"a producer header posing as an attribute": {ce(valid, ""),
			ceAttrs(map[string]string{sqs.HeadersAttribute: `{"ce-id":"` + pgoutbox.NewEventID().String() + `"}`})},
	}
	c := sqsClient()
	for name, v := range variants {
		in := &awssqs.SendMessageInput{QueueUrl: aws.String(tg.url), MessageBody: aws.String(v.body),
			MessageGroupId: aws.String(unique("hostile")), MessageDeduplicationId: aws.String(unique("d")),
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{}}
		for k, val := range v.attrs {
			in.MessageAttributes[k] = sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(val)}
		}
		_, err := c.SendMessage(t.Context(), in)
		pgtest.Must(t, err, "send %s", name)
	}
	// An Outbox-Event-Id as a Binary attribute is not read as the header.
	bin := base()
	delete(bin, wire.HeaderEventID)
	in := &awssqs.SendMessageInput{QueueUrl: aws.String(tg.url), MessageBody: aws.String(`{}`),
		MessageGroupId: aws.String(unique("hostile")), MessageDeduplicationId: aws.String(unique("d")),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			wire.HeaderEventID: {DataType: aws.String("Binary"), BinaryValue: []byte(valid.EventID.String())}}}
	for k, val := range bin {
		in.MessageAttributes[k] = sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(val)}
	}
	_, err := c.SendMessage(t.Context(), in)
	pgtest.Must(t, err, "send binary")
	// Behind them, the real event, and another as a well-formed structured
	// CloudEvent: the variants' base, so each refusal is its change's.
	tg.Publish(t, valid)
	other := inboxtest.Event("x1", 1)
	_, err = c.SendMessage(t.Context(), &awssqs.SendMessageInput{QueueUrl: aws.String(tg.url), MessageBody: aws.String(ce(other, "")),
		MessageGroupId: aws.String(unique("ce")), MessageDeduplicationId: aws.String(unique("d")),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			sqs.ContentTypeAttribute: {DataType: aws.String("String"), StringValue: aws.String("application/cloudevents+json")}}})
	pgtest.Must(t, err, "send the CloudEvent")

	e := newEffects(t)
	cons := e.Consumer(t, inbox.Config{}, nil)
	sub := start(t, cons, testConfig(tg.url, 2))
	want := int64(len(variants) + 1)
	wait.For(t, time.Minute, "every hostile message deleted and the events applied", func() bool {
		st := sub.Stats()
		return st.Undecodable >= want && st.Deleted >= 2
	})
	if n := e.Count(t, "effects", "true"); n != 2 {
		t.Fatalf("%d effects, want the two real events", n)
	}
}

func with(m map[string]string, k, v string) map[string]string {
	m[k] = v
	return m
}

// ce returns valid as a structured CloudEvent, with extra members (JSON,
// written last: a repeated name is the later one's).
func ce(valid broker.Message, extra string) string {
	s := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"/x","type":%q,"time":%q,%q:%q,%q:%q,%q:"1",%q:"1",`+
		`"datacontenttype":"application/json","data":{}`,
		valid.EventID.String(), valid.EventType, valid.OccurredAt.UTC().Format(time.RFC3339Nano),
		wire.CEExtAggregateType, valid.AggregateType, wire.CEExtAggregateID, valid.AggregateID, wire.CEExtSequence, wire.CEExtSchemaVersion)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

func ceAttrs(more map[string]string) map[string]string {
	m := map[string]string{sqs.ContentTypeAttribute: "application/cloudevents+json"}
	maps.Copy(m, more)
	return m
}
