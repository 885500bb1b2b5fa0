package null_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/null"
)

func TestPublish(t *testing.T) {
	var p null.Publisher
	res := p.Publish(context.Background(), make([]broker.Message, 3))
	if len(res) != 3 || res[0] != nil || p.Published() != 3 {
		t.Fatalf("results %v, published %d", res, p.Published())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res = p.Publish(ctx, make([]broker.Message, 2))
	if len(res) != 2 || res[1] != context.Canceled || p.Published() != 3 {
		t.Fatalf("cancelled: results %v, published %d", res, p.Published())
	}
}
