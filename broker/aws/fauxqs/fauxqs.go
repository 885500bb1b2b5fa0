// Package fauxqs runs the SQS and SNS emulator fauxqs (an npm package) on a
// port of its own, for the tests of package sqs, of package inbox/sqsinbox and
// of the CLI: one emulator a test package shares (Main), queues of a test's
// own on it (Queue), what a queue holds (Drain).
//
// The emulator and the Node.js it needs (22.5 or later, for node:sqlite, which
// the Debian nodejs package is too old for) are npm packages installed pinned
// and once per machine by internal/systool; the emulator keeps its data in
// memory only, so it loses everything when stopped.
//
// Outside the standard library it pulls in aws-sdk-go-v2 (the SQS client and
// static credentials, which the emulator accepts whatever they are), besides
// the root package (event ids for fresh names) and internal/systool.
package fauxqs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgoutbox/pgoutbox/internal/systool"
)

// The pinned packages.
var (
	// Emulator is the fauxqs release the tests run.
	Emulator = systool.NPM{Package: "fauxqs", Version: "2.4.1", Bin: "fauxqs"}
	// nodeVersion is the Node.js it runs on.
	nodeVersion = "22.23.5"
)

// Region is the region the emulator puts in its queue URLs and topic ARNs.
const Region = "us-east-1"

// readyTimeout bounds the wait for the emulator to accept connections: a
// first start on a busy machine compiles a lot of JavaScript.
const readyTimeout = 60 * time.Second

// Server is a running emulator.
type Server struct {
	// Endpoint is its base URL, http://127.0.0.1:port, for the SDK's
	// BaseEndpoint.
	Endpoint string

	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan error // receives Wait's result once
	once   sync.Once
}

// Start installs the emulator if needed and starts it on a free port of
// 127.0.0.1, returning once it accepts connections.
func Start() (*Server, error) {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	if runtime.GOOS != "linux" || arch == "" {
		return nil, fmt.Errorf("fauxqs: no pinned Node.js for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	node, err := systool.EnsureNPM(systool.NPM{Package: "node-linux-" + arch, Version: nodeVersion, Bin: "node"})
	if err != nil {
		return nil, fmt.Errorf("fauxqs: %w", err)
	}
	emu, err := systool.EnsureNPM(Emulator)
	if err != nil {
		return nil, fmt.Errorf("fauxqs: %w", err)
	}
	script := filepath.Join(emu.NodeModules(), "fauxqs", "dist", "cli.js")
	var last error
	for range 3 { // a free port may be taken before the emulator binds it
		s, err := start(node.Bin, script)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

func start(node, script string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fauxqs: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &Server{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), out: &bytes.Buffer{}}
	s.cmd = exec.Command(node, script)
	s.cmd.Env = append(os.Environ(), "FAUXQS_PORT="+strconv.Itoa(port), "FAUXQS_HOST=127.0.0.1",
		"FAUXQS_LOGGER=false", "FAUXQS_DEFAULT_REGION="+Region, "NODE_NO_WARNINGS=1")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("fauxqs: start: %w", err)
	}
	exited := make(chan error, 1)
	s.exited = exited
	go func() { exited <- s.cmd.Wait() }()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("fauxqs: exited before accepting connections: %v: %s", err, tail(s.out.Bytes()))
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			_ = c.Close()
			return s, nil
		}
		time.Sleep(50 * time.Millisecond) // polling a port: nothing to wait on
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-exited
	return nil, errors.New("fauxqs: not accepting connections within " + readyTimeout.String() + ": " + tail(s.out.Bytes()))
}

// Close stops the emulator and waits for it to exit; its data is lost. Safe
// to call twice.
func (s *Server) Close() {
	s.once.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	})
}

func tail(b []byte) string {
	if len(b) > 800 {
		b = b[len(b)-800:]
	}
	return string(b)
}

// AccessKey is the access key id (and secret) of [Server.Config]; the
// emulator accepts any.
const AccessKey = "test"

// Config is an AWS client configuration for the emulator.
func (s *Server) Config() aws.Config {
	return aws.Config{Region: Region, BaseEndpoint: aws.String(s.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(AccessKey, AccessKey, "")}
}

// drainVisibility is how long a received message stays hidden, in seconds:
// short, because a receive whose answer is lost (the SDK then retries it)
// leaves its messages hidden, and Drain waits for them to come back; long
// enough that Drain deletes what it received well before.
const drainVisibility = 5

// Drain receives and deletes every message of the queue at url, with their
// attributes and MessageGroupId, in the order received, until the queue
// counts none left (a FIFO queue may answer nothing while a group is held,
// so an empty receive alone does not end it).
func Drain(ctx context.Context, c *awssqs.Client, url string) ([]sqstypes.Message, error) {
	var got []sqstypes.Message
	var poll int32 // seconds a receive waits for a message: 0 until one came back empty
	for {
		out, err := c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: poll,
			MessageAttributeNames: []string{"All"}, VisibilityTimeout: drainVisibility,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameMessageGroupId}})
		if err != nil {
			return nil, fmt.Errorf("fauxqs: receive: %w", err)
		}
		for _, m := range out.Messages {
			if _, err := c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				return nil, fmt.Errorf("fauxqs: delete: %w", err)
			}
		}
		got = append(got, out.Messages...)
		if len(out.Messages) > 0 {
			continue
		}
		a, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
		if err != nil {
			return nil, fmt.Errorf("fauxqs: queue attributes: %w", err)
		}
		if a.Attributes["ApproximateNumberOfMessages"] == "0" && a.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0" {
			return got, nil
		}
		poll = 1
	}
}

// Attributes returns a received message's String attributes.
func Attributes(m sqstypes.Message) map[string]string {
	attrs := make(map[string]string, len(m.MessageAttributes))
	for k, v := range m.MessageAttributes {
		attrs[k] = aws.ToString(v.StringValue)
	}
	return attrs
}
