// Command inventoryd serves the inventory API and runs its maintenance tasks.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	_ "github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"

	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/migrations"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "inventoryd",
		Short:         "Inventory service: Redis pre-deduction, MySQL record, ordered RocketMQ sync",
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE:          serve,
	}
	root.AddCommand(&cobra.Command{Use: "serve", Short: "Serve the HTTP API (default)", RunE: serve})
	root.AddCommand(migrateCmd())
	return root
}

func logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func serve(cmd *cobra.Command, _ []string) error {
	log := logger()
	cfg, err := app.LoadConfig()
	if err != nil {
		return err
	}
	a, err := app.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := a.Start(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "signal", context.Cause(ctx).Error())
	case err := <-a.Done():
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return a.Shutdown(sctx)
}

func migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:       "migrate [up|down]",
		Short:     "Apply (up, default) or roll back (down) every schema migration on INVENTORY_MYSQL_DSN",
		Args:      cobra.MatchAll(cobra.MaximumNArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"up", "down"},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := app.LoadConfig()
			if err != nil {
				return err
			}
			if cfg.MySQLDSN == "" {
				return errors.New("migrate: INVENTORY_MYSQL_DSN is not set")
			}
			db, err := sql.Open("mysql", cfg.MySQLDSN)
			if err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			defer db.Close()
			if len(args) == 1 && args[0] == "down" {
				return migrations.DownAll(cmd.Context(), db)
			}
			return migrations.Up(cmd.Context(), db)
		},
	}
	return cmd
}
