package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/pressly/goose/v3"
)

// exactNames is migration 18 on MySQL: every identifier is compared byte for
// byte (docs/SPEC.md section 3, "Names are exact"). Until now the tables used
// the server's default collation (utf8mb4_general_ci on MariaDB), so the
// database took `PHONE-X` and `phone-x` for one row while Redis keys and Go
// maps took them for two. The migration converts every table, and the
// database's default for new ones, to utf8mb4_bin.
//
// Rows written under the old collation may already mix spellings of one
// name: an order line `phone-x` of the SKU `PHONE-X`, a buyer counted as
// `Alice` and `alice`. After the conversion those would silently become
// other names. So the migration first looks for them and, if any exist,
// refuses with a report of every group, changing nothing: an operator picks
// one spelling per group (UPDATE ... SET sku = 'PHONE-X' WHERE sku =
// 'phone-x' in each table listed) and runs migrate again.
var exactNames = goose.NewGoMigration(18,
	&goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error {
		report, err := Collisions(ctx, db)
		if err != nil {
			return err
		}
		if len(report) > 0 {
			return fmt.Errorf("names that differ only in letter case are stored as one under the old collation; "+
				"choose one spelling for each and run migrate again:\n  %s", strings.Join(report, "\n  "))
		}
		return convert(ctx, db, "utf8mb4_bin")
	}},
	&goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error {
		return convert(ctx, db, "utf8mb4_general_ci")
	}},
)

// identifierTables are the tables migration 18 converts (later tables are
// created binary).
var identifierTables = []string{"skus", "orders", "order_items", "stock_outbox", "stock_ledger",
	"stock_anomalies", "stock_reservations", "stock_movements", "buyer_quotas"}

// nameDomains lists, per kind of name, every column that holds one. Unique
// keys kept two spellings out of one column; they can meet across columns.
var nameDomains = []struct {
	kind    string
	columns []string // table.column
}{
	{"sku", []string{"skus.sku", "order_items.sku", "stock_reservations.sku", "buyer_quotas.sku",
		"stock_outbox.sku", "stock_ledger.sku", "stock_anomalies.sku", "stock_movements.sku"}},
	{"reservation token", []string{"stock_reservations.token", "orders.reservation_token",
		"stock_outbox.token", "stock_ledger.token", "stock_anomalies.token"}},
	{"order id", []string{"orders.id", "order_items.order_id", "stock_reservations.order_id"}},
	{"user id", []string{"orders.user_id", "stock_reservations.buyer", "buyer_quotas.user_id"}},
}

// Collisions lists every group of stored names that are equal under the old
// case-insensitive collation and differ byte for byte, one line per
// spelling: "sku PHONE-X ~ phone-x: phone-x in order_items (3 rows), ...".
func Collisions(ctx context.Context, db *sql.DB) ([]string, error) {
	var out []string
	for _, d := range nameDomains {
		var parts []string
		for _, tc := range d.columns {
			table, col, _ := strings.Cut(tc, ".")
			parts = append(parts, fmt.Sprintf(
				"SELECT CONVERT(%s USING utf8mb4) COLLATE utf8mb4_bin AS v, '%s' AS t FROM %s WHERE %s IS NOT NULL",
				col, tc, table, col))
		}
		all := strings.Join(parts, " UNION ALL ")
		q := fmt.Sprintf(`SELECT a.v, a.t, COUNT(*) FROM (%s) a
			JOIN (SELECT v COLLATE utf8mb4_general_ci AS k FROM (%s) b GROUP BY k
			      HAVING COUNT(DISTINCT CAST(v AS BINARY)) > 1) g ON a.v COLLATE utf8mb4_general_ci = g.k
			GROUP BY a.v, a.t ORDER BY a.v COLLATE utf8mb4_general_ci, a.v, a.t`, all, all)
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("looking for names that differ only in case (%s): %w", d.kind, err)
		}
		var cur string
		for rows.Next() {
			var v, t string
			var n int64
			if err := rows.Scan(&v, &t, &n); err != nil {
				rows.Close()
				return nil, err
			}
			line := fmt.Sprintf("%s %q in %s (%d rows)", d.kind, v, t, n)
			if len(out) > 0 && cur == v {
				out[len(out)-1] += "; " + fmt.Sprintf("%s (%d rows)", t, n)
				continue
			}
			cur = v
			out = append(out, line)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// convert sets the collation of every table's text columns and of the
// database's default. Each statement is idempotent, so a run that stopped
// half way (MySQL DDL commits as it goes) is finished by running it again.
func convert(ctx context.Context, db *sql.DB, collation string) error {
	if _, err := db.ExecContext(ctx, "ALTER DATABASE CHARACTER SET utf8mb4 COLLATE "+collation); err != nil {
		return err
	}
	for _, t := range identifierTables {
		if _, err := db.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s CONVERT TO CHARACTER SET utf8mb4 COLLATE %s", t, collation)); err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
	}
	return nil
}
