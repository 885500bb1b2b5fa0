package mqtt_test

import (
	"context"
	"fmt"
	"log"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
)

// Publish an event to the Mosquitto on localhost:1883 and read it back as a
// subscriber does, with ParseReceived.
func Example() {
	ctx := context.Background()
	topic := broker.MustParseTemplate("example-" + unique("t") + "/{aggregate_type}/{event_type}")

	// A subscriber, connected before the event is published.
	received := make(chan []byte, 1)
	sub := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://127.0.0.1:1883").SetClientID(unique("example-sub")))
	if tok := sub.Connect(); tok.Wait() && tok.Error() != nil {
		log.Fatal(tok.Error())
	}
	defer sub.Disconnect(250)
	filter := topic.ExpandFunc(func(string) string { return "+" })
	if tok := sub.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) { received <- m.Payload() }); tok.Wait() && tok.Error() != nil {
		log.Fatal(tok.Error())
	}

	// The publisher: QoS 1, a persistent session under a stable client id.
	clientID := unique("example-relay")
	pub, err := mqtt.New("mqtt://127.0.0.1:1883", mqtt.Config{ClientID: clientID, Topic: topic})
	if err != nil {
		log.Fatal(err)
	}
	results := pub.Publish(ctx, []broker.Message{brokertest.Message("order", "42", 1)})
	fmt.Println("result:", results[0])
	_ = pub.Close()

	m, err := mqtt.ParseReceived(<-received, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(m.AggregateType, m.AggregateID, m.AggregateSequence, m.EventType, string(m.Payload))

	// The broker keeps the relay's session; a clean connect under its id ends it.
	end := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://127.0.0.1:1883").SetClientID(clientID))
	if tok := end.Connect(); tok.Wait() && tok.Error() == nil {
		end.Disconnect(250)
	}
	// Output:
	// result: <nil>
	// order 42 1 created {"total":"9.50"}
}
