package sqsinbox

import (
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// NakThenDeliver settles msgs, received from the queue at url, as one group's
// run of one receive: the first is handed back for a retry after delay, then
// each other is offered to the inbox; it returns whether each was. (The
// emulator returns one message per group and receive, so the run is made
// up here.)
func NakThenDeliver(s *Subscriber, url string, msgs []sqstypes.Message, delay time.Duration) []bool {
	s.url = url
	run := &groupRun{}
	b := queueBroker{s}
	b.Nak(&message{Message: msgs[0], run: run}, delay)
	var offered []bool
	for _, m := range msgs[1:] {
		_, ok := b.Delivery(&message{Message: m, run: run})
		offered = append(offered, ok)
	}
	return offered
}
