package ordersvc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/examples/orders"
)

// RunConfig configures Run.
type RunConfig struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// Schema holds the tables; Run creates them if missing. Defaults to "public".
	Schema string
	// Addr is the HTTP listen address. Defaults to "127.0.0.1:8080".
	Addr string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Run migrates the schema and serves the HTTP API until ctx ends, then shuts the
// server down gracefully.
func Run(ctx context.Context, cfg RunConfig) error {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:8080"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()
	if err := orders.Migrate(ctx, pool, cfg.Schema); err != nil {
		return err
	}
	svc, err := New(pool, &Config{Schema: cfg.Schema, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	cfg.Logger.Info("order service listening", slog.String("addr", ln.Addr().String()), slog.String("schema", cfg.Schema))
	return orders.Serve(ctx, ln, svc.Handler(), 10*time.Second)
}
