package nats

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig configures an in-process NATS server with JetStream.
type EmbeddedConfig struct {
	// StoreDir is where JetStream keeps its streams; reuse it to keep the data
	// across restarts. Required.
	StoreDir string

	// Host is the address to listen on. Defaults to "127.0.0.1", so the server
	// is not reachable from other machines unless asked for.
	Host string

	// Port is the client port; -1 picks a free one (see Embedded.URL). Defaults
	// to 4222, the NATS default.
	Port int

	// ReadyTimeout bounds the wait for the server to accept connections.
	// Defaults to 10s.
	ReadyTimeout time.Duration

	// Logger receives the server's log; nil discards it. Defaults to nil.
	Logger *slog.Logger
}

// Embedded is a running in-process NATS server with JetStream enabled.
type Embedded struct {
	srv  *server.Server
	once sync.Once
}

// StartEmbedded starts a NATS server in this process and returns once it accepts
// connections with JetStream enabled.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("nats: EmbeddedConfig.StoreDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = 4222
	}
	if cfg.Port < -1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("nats: EmbeddedConfig.Port %d: want -1 or a port number", cfg.Port)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	if cfg.ReadyTimeout < 0 {
		return nil, fmt.Errorf("nats: EmbeddedConfig.ReadyTimeout %s: must be positive", cfg.ReadyTimeout)
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "pgoutbox-embedded",
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true, // signals belong to the host program
		NoLog:      cfg.Logger == nil,
	})
	if err != nil {
		return nil, fmt.Errorf("nats: embedded server: %w", err)
	}
	if cfg.Logger != nil {
		srv.SetLoggerV2(serverLog{cfg.Logger}, false, false, false)
	}
	// Start returns once the accept loop runs; a failure (port taken, store
	// unusable) shows only as the server never becoming ready.
	go srv.Start()
	if !srv.ReadyForConnections(cfg.ReadyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("nats: embedded server on %s:%d not ready within %s (port in use, or store %s unusable?)",
			cfg.Host, cfg.Port, cfg.ReadyTimeout, cfg.StoreDir)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("nats: embedded server: JetStream did not start (store %s)", cfg.StoreDir)
	}
	return &Embedded{srv: srv}, nil
}

// URL returns the client URL of the server, e.g. nats://127.0.0.1:4222.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server and returns once it has stopped, its store flushed.
// It is safe to call more than once.
func (e *Embedded) Shutdown() {
	e.once.Do(func() {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	})
}

// serverLog adapts slog to the server's logger interface.
type serverLog struct{ l *slog.Logger }

func (s serverLog) Noticef(format string, v ...any) { s.l.Info(fmt.Sprintf(format, v...)) }
func (s serverLog) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s serverLog) Errorf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s serverLog) Debugf(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLog) Tracef(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }

// Fatalf logs only: the host program, not the embedded server, decides to exit;
// StartEmbedded reports the failure.
func (s serverLog) Fatalf(format string, v ...any) { s.l.Error(fmt.Sprintf(format, v...)) }
