// Command watermillsql is the peer cell of 'pgoutbox bench --scenario enqueue':
// one round of business transactions, each publishing one message with the real
// watermill-sql (v4) publisher on the transaction behind watermill's forwarder
// (its outbox pattern), timed as the bench times its own cells. It lives in a
// module of its own (bench/peers) so that neither the library nor the CLI
// depends on watermill; the bench runs it as a subprocess (--enqueue-peer-bin).
//
// Build it from the repository's root:
//
//	go build -o watermillsql ./bench/peers/watermillsql
//
// The database comes from DATABASE_URL (never the command line, which ps
// shows). The protocol on stdout is two JSON lines: once the connections are
// open, the messages table ("watermill_outbox" in -schema) is created if
// missing and emptied, and every connection is warmed, {"backend_pids":[…]};
// then, after a line on stdin, the round runs for -duration and prints
// {"commits":…,"seconds":…,"cpu_ns":…,"last_id":…,"latency":{…}}, and keeps its
// connections (for their backends' CPU to be read) until stdin ends. Errors go
// to stderr with exit status 1.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// maxPayloadBytes bounds -payload.
const maxPayloadBytes = 1 << 20

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runMain(ctx, os.Args[1:], os.Getenv("DATABASE_URL"), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "watermillsql:", err)
		os.Exit(1)
	}
}

// runMain parses args, runs one round and writes the protocol's two lines to out.
func runMain(ctx context.Context, args []string, dbURL string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("watermillsql", flag.ContinueOnError)
	cfg := roundConfig{DatabaseURL: dbURL}
	var payload string
	fs.StringVar(&cfg.Schema, "schema", "", "schema of the business table and of the messages table")
	fs.StringVar(&cfg.BusinessSQL, "business-sql", "", "the business statement, with the row id as $1")
	fs.IntVar(&cfg.Producers, "producers", 1, "concurrent producers, each on a connection of its own")
	fs.DurationVar(&cfg.Duration, "duration", 0, "how long the round runs")
	fs.Int64Var(&cfg.FirstID, "first-id", 1, "the first business row id")
	fs.StringVar(&payload, "payload", "", "the message's payload: a JSON object, marshalled again per transaction")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(payload) > maxPayloadBytes {
		return fmt.Errorf("-payload: %d bytes, at most %d", len(payload), maxPayloadBytes)
	}
	if payload != "" {
		if err := json.Unmarshal([]byte(payload), &cfg.Payload); err != nil {
			return fmt.Errorf("-payload: not a JSON object: %w", err)
		}
	}
	p, err := open(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.close()
	pids, err := p.backendPids(ctx)
	if err != nil {
		return fmt.Errorf("backend pids: %w", err)
	}
	enc := json.NewEncoder(out)
	if err := enc.Encode(map[string][]int{"backend_pids": pids}); err != nil {
		return err
	}
	rd := bufio.NewReader(in)
	if _, err := rd.ReadString('\n'); err != nil {
		return errors.New("stdin closed before the go-ahead line")
	}
	res, err := p.run(ctx)
	if err != nil {
		return err
	}
	if err := enc.Encode(res); err != nil {
		return err
	}
	// The connections stay open until stdin ends, so that the bench can read
	// their backends' CPU after the round.
	_, _ = io.Copy(io.Discard, rd)
	return nil
}
