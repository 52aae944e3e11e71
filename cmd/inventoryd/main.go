// Command inventoryd serves the inventory API and runs its maintenance tasks.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
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

// version is set at build time (-ldflags "-X main.version=v1.2.3"; the
// Dockerfile passes VERSION); otherwise the module's, or "devel".
var version = ""

// versionString is what --version prints: the version, the commit the
// binary was built from (when go build could read it), and the Go version.
func versionString() string {
	v, commit, at, dirty := version, "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := cmp.Or(v, "devel")
	if commit != "" {
		out += " commit " + commit[:min(12, len(commit))]
		if dirty {
			out += " (modified)"
		}
		if at != "" {
			out += " of " + at
		}
	}
	return out + " " + runtime.Version()
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "inventoryd",
		Short: "Inventory service: Redis pre-deduction, MySQL record, ordered RocketMQ sync",
		Long: `inventoryd serves the inventory API. With none of INVENTORY_REDIS_URL,
INVENTORY_REDIS_CLUSTER, INVENTORY_MYSQL_DSN and INVENTORY_ROCKETMQ_NAMESRV set it
runs on embedded stand-ins (in-process Redis, SQLite, queue) for trying it out.
"inventoryd serve --help" lists the configuration.`,
		Version:      versionString(),
		SilenceUsage: true,
		RunE:         serve,
	}
	root.SetVersionTemplate("inventoryd {{.Version}}\n")
	root.AddCommand(&cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API (the default)",
		Long: `serve serves the HTTP API. Configuration is by environment; with none of the
Redis, MySQL and RocketMQ variables set it runs embedded (everything in
memory, secrets generated and printed). With any of them set it needs all of
them and the four secrets. "inventoryd config check" validates an environment
without starting anything.

Environment (variable, default, meaning):
` + app.Help(),
		Args: cobra.NoArgs,
		RunE: serve,
	})
	root.AddCommand(migrateCmd(), reconcileCmd(), configCmd(), importCmd())
	return root
}

func configCmd() *cobra.Command {
	cfg := &cobra.Command{Use: "config", Short: "Check a configuration"}
	cfg.AddCommand(&cobra.Command{
		Use:   "check [serve|migrate|reconcile]",
		Short: "Validate the environment for a command (serve by default) without connecting to anything",
		Long: `config check reads the environment exactly as the command would (serve by
default, or migrate or reconcile) and validates it without starting or
connecting to anything: every variable the command needs is set, addresses
parse, durations are in range, secrets are strong and distinct. It prints
what the configuration points at (never a secret) and exits 0, or prints
what is wrong and exits 1. Run it in the container's environment before
starting it (docker compose run --rm --no-deps inventoryd config check).`,
		Args:      cobra.MatchAll(cobra.MaximumNArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{string(app.Serve), string(app.Migrate), string(app.Reconcile)},
		RunE: func(cmd *cobra.Command, args []string) error {
			what := app.Serve
			if len(args) == 1 {
				what = app.Command(args[0])
			}
			c, err := app.ParseConfig()
			if err != nil {
				return err
			}
			if err := c.ValidateFor(what); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "config: ok for %s: %s\n", what, c.Summary(what))
			return nil
		},
	})
	return cfg
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
		Use:   "migrate [up|contract|down]",
		Short: "Apply every pending schema migration (up, default), contract the schema after a roll (contract), or roll back the newest step (down)",
		Long: `migrate up applies every pending migration on INVENTORY_MYSQL_DSN and creates
the ordered RocketMQ topic when INVENTORY_ROCKETMQ_NAMESRV is set and it is missing.
On a new database it also applies the contract.
migrate contract removes what older releases still use (today: the orders'
index on Idempotency-Keys, after copying every key into idempotency_keys).
Run it once every node serving the database runs this release.
migrate down rolls back one step, the newest (a contract step first);
--all rolls back every one.`,
		Args:      cobra.MatchAll(cobra.MaximumNArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"up", "contract", "down"},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := app.ParseConfig()
			if err != nil {
				return err
			}
			if err := cfg.ValidateFor(app.Migrate); err != nil {
				return err
			}
			db, err := sql.Open("mysql", cfg.MySQLDSN)
			if err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			defer db.Close()
			down := len(args) == 1 && args[0] == "down"
			switch {
			case len(args) == 1 && args[0] == "contract" && !all:
				n, err := migrations.Contract(cmd.Context(), db, migrations.MySQL)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "migrate: contracted (%d steps applied)\n", n)
				return nil
			case all && !down:
				return errors.New("migrate: --all goes with down")
			case down && all:
				if err := migrations.DownAll(cmd.Context(), db, migrations.MySQL); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "migrate: rolled back every migration")
				return nil
			case down:
				step, err := migrations.Down(cmd.Context(), db, migrations.MySQL)
				if err != nil {
					return err
				}
				if step.Version == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "migrate: nothing to roll back")
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "migrate: rolled back %s\n", step)
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
flight shows as a difference of its units. It needs INVENTORY_REDIS_URL (or
INVENTORY_REDIS_CLUSTER) and INVENTORY_MYSQL_DSN only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := app.ParseConfig()
			if err != nil {
				return err
			}
			if err := cfg.ValidateFor(app.Reconcile); err != nil {
				return err
			}
			a, err := app.OpenStores(cmd.Context(), cfg, logger())
			if err != nil {
				return err
			}
			defer a.Close()
			reports, err := a.Reconciler.Reconcile(cmd.Context(), repair)
			if err != nil {
				return err
			}
			camps, err := a.Reconciler.ReconcileCampaigns(cmd.Context(), repair)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			for _, r := range reports {
				_ = enc.Encode(r)
			}
			for _, r := range camps {
				_ = enc.Encode(r)
			}
			if len(reports)+len(camps) > 0 && !repair {
				return exitCode(2)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&repair, "repair", false, "realign every SKU and campaign found out of balance")
	return cmd
}
