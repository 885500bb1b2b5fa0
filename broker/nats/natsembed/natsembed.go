// Package natsembed runs a NATS server with JetStream inside the calling process,
// for demos ("pgoutbox demo", "pgoutbox relay --broker embedded") and for tests
// that need a server of their own, one they can stop and restart.
//
// It is a package of its own so that importing broker/nats links only the NATS
// client: this package imports the whole nats-server (and its dependencies:
// jwt, nkeys, highwayhash, klauspost/compress, golang.org/x/crypto, sys and
// time), which a relay talking to a real server never needs.
//
// Outside the standard library it pulls in nats-server (the whole NATS server,
// embedded), and nothing else.
package natsembed

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Defaults of Config.
const (
	// DefaultHost is the listen address when Config.Host is empty: loopback
	// only, so the server is not reachable from other machines unless asked for.
	DefaultHost = "127.0.0.1"
	// DefaultPort is the client port when Config.Port is zero, the NATS default.
	DefaultPort = 4222
	// DefaultReadyTimeout bounds the wait for the server to accept connections
	// when Config.ReadyTimeout is zero.
	DefaultReadyTimeout = 10 * time.Second
)

// RandomPort as Config.Port makes the server listen on a free port; see
// Server.URL.
const RandomPort = -1

// Config configures an in-process NATS server with JetStream. A nil *Config
// means all defaults.
type Config struct {
	// StoreDir is where JetStream keeps its streams; reuse it to keep the data
	// across restarts. Empty means a new temporary directory, removed by
	// Shutdown: the streams then last as long as the server.
	StoreDir string

	// Host is the address to listen on. Empty means DefaultHost ("127.0.0.1").
	Host string

	// Port is the client port; RandomPort (-1) picks a free one (see
	// Server.URL). Zero means DefaultPort (4222).
	Port int

	// ReadyTimeout bounds the wait for the server to accept connections. Zero
	// means DefaultReadyTimeout (10s).
	ReadyTimeout time.Duration

	// Logger receives the server's log; nil discards it.
	Logger *slog.Logger
}

// Validate reports whether c can start a server, naming each invalid field.
// Zero fields mean their defaults; a nil c is valid.
func (c *Config) Validate() error {
	if c == nil {
		return nil
	}
	var errs []error
	if c.Port < RandomPort || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("natsembed: Config.Port (%d): want -1 (a free port) or a port number", c.Port))
	}
	if c.ReadyTimeout < 0 {
		errs = append(errs, fmt.Errorf("natsembed: Config.ReadyTimeout (%s) must be positive", c.ReadyTimeout))
	}
	return errors.Join(errs...)
}

// Server is a running in-process NATS server with JetStream enabled.
type Server struct {
	srv     *server.Server
	tempDir string // removed by Shutdown; "" when the caller gave StoreDir
	once    sync.Once
}

// New starts a NATS server with JetStream in this process, configured by cfg
// (nil means all defaults), and returns once it accepts connections. The caller
// must call Shutdown.
func New(cfg *Config) (*Server, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	s := &Server{}
	if c.StoreDir == "" {
		dir, err := os.MkdirTemp("", "pgoutbox-natsembed-")
		if err != nil {
			return nil, fmt.Errorf("natsembed: store directory: %w", err)
		}
		c.StoreDir, s.tempDir = dir, dir
	}
	srv, err := s.start(c)
	if err != nil {
		s.removeTemp()
		return nil, err
	}
	s.srv = srv
	return s, nil
}

func (s *Server) start(c Config) (*server.Server, error) {
	srv, err := server.NewServer(&server.Options{
		ServerName: "pgoutbox-embedded",
		Host:       c.Host,
		Port:       c.Port,
		JetStream:  true,
		StoreDir:   c.StoreDir,
		NoSigs:     true, // signals belong to the host program
		NoLog:      c.Logger == nil,
	})
	if err != nil {
		return nil, fmt.Errorf("natsembed: server: %w", err)
	}
	if c.Logger != nil {
		srv.SetLoggerV2(serverLog{c.Logger}, false, false, false)
	}
	// Start returns once the accept loop runs; a failure (port taken, store
	// unusable) shows only as the server never becoming ready.
	go srv.Start()
	if !srv.ReadyForConnections(c.ReadyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("natsembed: server on %s:%d not ready within %s (port in use, or store %s unusable?)",
			c.Host, c.Port, c.ReadyTimeout, c.StoreDir)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("natsembed: JetStream did not start (store %s)", c.StoreDir)
	}
	return srv, nil
}

// URL returns the client URL of the server, e.g. nats://127.0.0.1:4222.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and returns once it has stopped, its store flushed
// (or removed, if New made it a temporary directory). It is safe to call more
// than once.
func (s *Server) Shutdown() {
	s.once.Do(func() {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.removeTemp()
	})
}

func (s *Server) removeTemp() {
	if s.tempDir != "" {
		_ = os.RemoveAll(s.tempDir)
	}
}

// serverLog adapts slog to the server's logger interface.
type serverLog struct{ l *slog.Logger }

func (s serverLog) Noticef(format string, v ...any) { s.l.Info(fmt.Sprintf(format, v...)) }
func (s serverLog) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s serverLog) Errorf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s serverLog) Debugf(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLog) Tracef(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }

// Fatalf logs only: the host program, not the embedded server, decides to exit;
// New reports the failure.
func (s serverLog) Fatalf(format string, v ...any) { s.l.Error(fmt.Sprintf(format, v...)) }
