// Command inventoryd serves the inventory API and runs its maintenance tasks.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
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
	"github.com/acme/inventory/mq"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		var ex exitCode
		if errors.As(err, &ex) {
			os.Exit(int(ex))
		}
		os.Exit(1)
	}
}

// exitCode ends the process with that status, without printing an error.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "inventoryd",
		Short: "Inventory service: Redis pre-deduction, MySQL record, ordered RocketMQ sync",
		Long: `inventoryd serves the inventory API. With none of INVENTORY_REDIS_URL,
INVENTORY_REDIS_CLUSTER, INVENTORY_MYSQL_DSN and INVENTORY_ROCKETMQ_NAMESRV set it
runs on embedded stand-ins (in-process Redis, SQLite, queue) for trying it out.`,
		SilenceUsage: true,
		RunE:         serve,
	}
	root.AddCommand(&cobra.Command{Use: "serve", Short: "Serve the HTTP API (the default)", RunE: serve})
	root.AddCommand(migrateCmd(), reconcileCmd())
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
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	a, err := app.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	if cfg.Embedded() {
		if err := a.Seed(ctx); err != nil {
			return err
		}
		fmt.Fprint(cmd.OutOrStdout(), a.Banner()) // secrets go to the terminal, never to the log
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "cause", context.Cause(ctx).Error())
	case err := <-a.Done():
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return a.Shutdown(sctx)
}

func migrateCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "migrate [up|down]",
		Short: "Apply every pending schema migration (up, default), or roll back the newest one (down)",
		Long: `migrate up applies every pending migration on INVENTORY_MYSQL_DSN and creates
the ordered RocketMQ topic when INVENTORY_ROCKETMQ_NAMESRV is set and it is missing.
migrate down rolls back one migration, the newest; --all rolls back every one.`,
		Args:      cobra.MatchAll(cobra.MaximumNArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"up", "down"},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := app.ParseConfig()
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
			down := len(args) == 1 && args[0] == "down"
			switch {
			case all && !down:
				return errors.New("migrate: --all goes with down")
			case down && all:
				if err := migrations.DownAll(cmd.Context(), db, migrations.MySQL); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "migrate: rolled back every migration")
				return nil
			case down:
				v, err := migrations.Down(cmd.Context(), db, migrations.MySQL)
				if err != nil {
					return err
				}
				if v == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "migrate: nothing to roll back")
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "migrate: rolled back version %d\n", v)
				}
				return nil
			}
			if err := migrations.Up(cmd.Context(), db, migrations.MySQL); err != nil {
				return err
			}
			return migrateTopic(cmd, cfg)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "with down: roll back every migration, not only the newest")
	return cmd
}

// migrateTopic creates the ordered topic when INVENTORY_ROCKETMQ_NAMESRV is
// set and the topic is missing: a fresh broker has none, and the consumer
// cannot subscribe to a topic without a route. An existing topic is left as
// it is; down leaves the topic too (its messages may still matter).
func migrateTopic(cmd *cobra.Command, cfg app.Config) error {
	if len(cfg.RocketMQNamesrv) == 0 {
		return nil
	}
	topic := cfg.RocketMQTopic
	created, err := mq.EnsureTopic(cmd.Context(), cfg.RocketMQNamesrv, topic, mq.DefaultQueues)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if created {
		fmt.Fprintf(cmd.OutOrStdout(), "rocketmq: created topic %s with %d queues\n", topic, mq.DefaultQueues)
	} else {
		fmt.Fprintf(cmd.OutOrStdout(), "rocketmq: topic %s exists, left as it is\n", topic)
	}
	return nil
}

func reconcileCmd() *cobra.Command {
	var repair bool
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Report every SKU where Redis and the database disagree (exit 2 if any)",
		Long: `reconcile checks every SKU: Redis available = on_hand - reserved, reserved =
the sum of live reservations, and no unresolved anomaly. It prints one JSON
line per SKU where a check fails. With --repair it realigns Redis from the
database and sets reserved to the live sum (anomalies need an operator).
Redis numbers are exact at a quiet point; under traffic an admission in
flight shows as a difference of its units.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := app.LoadConfig()
			if err != nil {
				return err
			}
			if cfg.Embedded() {
				return errors.New("reconcile: configure the servers to check (INVENTORY_REDIS_URL, INVENTORY_MYSQL_DSN, ...)")
			}
			a, err := app.New(cmd.Context(), cfg, logger())
			if err != nil {
				return err
			}
			defer a.Shutdown(context.Background())
			reports, err := a.Catalog.Reconcile(cmd.Context(), repair)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			for _, r := range reports {
				_ = enc.Encode(r)
			}
			if len(reports) > 0 && !repair {
				return exitCode(2)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&repair, "repair", false, "realign every SKU found out of balance")
	return cmd
}
