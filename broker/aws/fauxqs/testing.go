package fauxqs

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgoutbox/pgoutbox"
)

// Main is the TestMain of a package whose tests share one emulator: it starts
// the emulator and stores it in *s, runs the tests, stops the emulator and
// exits with the tests' code. A failure to start fails the package, never
// skips it: the error says how to install what is missing. check, when set,
// runs after tests that passed (a goroutine leak check); its error fails the
// package.
func Main(m *testing.M, s **Server, check func() error) {
	srv, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*s = srv
	code := m.Run()
	srv.Close()
	if code == 0 && check != nil {
		if err := check(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// Unique returns prefix and a fresh event id: the name of a queue or topic of
// the test's own on the shared emulator.
func Unique(prefix string) string { return prefix + "-" + pgoutbox.NewEventID().String() }

// Queue creates a queue of the test's own, named Unique(prefix) (with the
// ".fifo" suffix when fifo), and deletes it at the end of the test; it
// returns its name and URL.
func (s *Server) Queue(tb testing.TB, prefix string, fifo bool) (name, url string) {
	tb.Helper()
	name, attrs := Unique(prefix), map[string]string{}
	if fifo {
		name += ".fifo"
		attrs[string(sqstypes.QueueAttributeNameFifoQueue)] = "true"
	}
	c := awssqs.NewFromConfig(s.Config())
	out, err := c.CreateQueue(tb.Context(), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		tb.Fatalf("fauxqs: create queue %s: %v", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return name, url
}
