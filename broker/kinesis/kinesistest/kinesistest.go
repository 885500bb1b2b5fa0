// Package kinesistest runs kinesalite, a Kinesis emulator, for tests: the
// adapter's own and the CLI's end-to-end tests. It installs kinesalite with
// npm when it is missing (internal/systool) and fails the test, never skips,
// when it cannot.
//
// Outside the standard library (testing) it pulls in the AWS SDK for Go v2
// (aws-sdk-go-v2 with its credentials and Kinesis service modules) and what
// the adapter pulls in.
package kinesistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/pgoutbox/pgoutbox/internal/systool"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// Kinesalite is the pinned emulator.
var Kinesalite = systool.NPM{Package: "kinesalite", Version: "3.3.3", Bin: "kinesalite"}

// Credentials and region the emulator is used with (it checks that requests
// are signed, not by whom).
const (
	AccessKeyID     = "pgoutbox-test"
	SecretAccessKey = "pgoutbox-test-secret"
	Region          = "us-east-1"
)

// Env returns the environment that gives a process (the CLI) the emulator's
// credentials and region through the AWS default chain.
func Env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + AccessKeyID,
		"AWS_SECRET_ACCESS_KEY=" + SecretAccessKey,
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=" + os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
	}
}

// Server is one kinesalite process.
type Server struct {
	// Endpoint is the emulator's URL, e.g. http://127.0.0.1:4567.
	Endpoint string

	bin, dir string
	port     int
	mu       sync.Mutex
	cmd      *exec.Cmd // nil while stopped
}

// Start starts kinesalite on a free port and stops it at the test's end. dir,
// when not empty, keeps its data on disk there, so that Stop and Start keep
// it; empty keeps it in memory.
func Start(tb testing.TB, dir string) *Server {
	tb.Helper()
	s, err := start(systool.NeedNPM(tb, Kinesalite).Bin, dir)
	if err != nil {
		tb.Fatalf("kinesistest: %v", err)
	}
	tb.Cleanup(func() { _ = s.Stop() })
	return s
}

func start(bin, dir string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &Server{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), bin: bin, dir: dir, port: port}
	return s, s.Restart()
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Shared returns the test binary's one in-memory kinesalite, started at the
// first call; call StopShared from TestMain after m.Run.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	s, err := EnsureShared()
	if err != nil {
		tb.Fatalf("kinesistest: %v", err)
	}
	return s
}

// EnsureShared is Shared for code without a testing.TB (an Example).
func EnsureShared() (*Server, error) {
	sharedOnce.Do(func() {
		var i systool.Installed
		if i, sharedErr = systool.EnsureNPM(Kinesalite); sharedErr == nil {
			shared, sharedErr = start(i.Bin, "")
		}
	})
	return shared, sharedErr
}

// StopShared stops the kinesalite Shared started, if any.
func StopShared() {
	if shared != nil {
		_ = shared.Stop()
	}
}

// Stop stops the emulator, keeping the data of a server with a directory.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
	s.cmd = nil
	return nil
}

// Restart starts the stopped emulator again on its port and waits until it
// accepts connections.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	args := []string{"--port", strconv.Itoa(s.port), "--createStreamMs", "0", "--deleteStreamMs", "0",
		"--updateStreamMs", "0", "--shardLimit", "10000"}
	if s.dir != "" {
		args = append(args, "--path", s.dir)
	}
	cmd := exec.Command(s.bin, args...)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kinesalite: %w", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(s.port)
	if !wait.Until(60*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("kinesalite (%s %v) did not listen on %s within 60 s", s.bin, args, addr)
	}
	s.cmd = cmd
	return nil
}

// Client returns a Kinesis client of the emulator, with the test credentials.
func (s *Server) Client() *kinesis.Client {
	return kinesis.New(kinesis.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
	})
}

// UniqueName returns prefix followed by random hex, a valid stream name.
func UniqueName(prefix string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// CreateStream creates a stream of the given shards with a unique name, waits
// until it is ACTIVE, and deletes it at the test's end.
func (s *Server) CreateStream(tb testing.TB, shards int32) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := s.Client()
	name := UniqueName("pgoutbox-test")
	if _, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(shards)}); err != nil {
		tb.Fatalf("kinesistest: create stream: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = s.Client().DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(name)})
	})
	w := kinesis.NewStreamExistsWaiter(c, func(o *kinesis.StreamExistsWaiterOptions) {
		o.MinDelay = 10 * time.Millisecond
		o.MaxDelay = time.Second
	})
	if err := w.Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(name)}, 60*time.Second); err != nil {
		tb.Fatalf("kinesistest: stream %s not ACTIVE: %v", name, err)
	}
	return name
}

// Record is one record as read back.
type Record struct {
	Shard        string
	PartitionKey string
	Data         []byte
}

// ReadAll returns every record of the stream, shard after shard, each shard's
// in its order: what a consumer reading from TRIM_HORIZON sees.
func ReadAll(ctx context.Context, c *kinesis.Client, stream string) ([]Record, error) {
	shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		return nil, fmt.Errorf("list shards: %w", err)
	}
	var out []Record
	for _, sh := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream),
			ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			return nil, fmt.Errorf("shard iterator of %s: %w", aws.ToString(sh.ShardId), err)
		}
		iter := it.ShardIterator
		for iter != nil {
			got, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter})
			if err != nil {
				return nil, fmt.Errorf("records of %s: %w", aws.ToString(sh.ShardId), err)
			}
			for _, r := range got.Records {
				out = append(out, Record{Shard: aws.ToString(sh.ShardId), PartitionKey: aws.ToString(r.PartitionKey), Data: r.Data})
			}
			if len(got.Records) == 0 {
				break // caught up: an open shard's iterator never ends
			}
			iter = got.NextShardIterator
		}
	}
	if shards.NextToken != nil {
		return nil, errors.New("more shards than one ListShards page")
	}
	return out, nil
}
