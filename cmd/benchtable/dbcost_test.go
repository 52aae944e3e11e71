package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/acme/inventory/internal/prepconn"
	"github.com/acme/inventory/testkit/testenv"
)

// countingTx counts the statements a variant's steps send.
type countingTx struct {
	costTx
	n *int
}

func (c countingTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	*c.n++
	return c.costTx.ExecContext(ctx, query, args...)
}

func (c countingTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	*c.n++
	return c.costTx.QueryContext(ctx, query, args...)
}

// costDB is a test database with dbcost's schema.
func costDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := testenv.MySQL(t).DB()
	if err != nil {
		t.Fatal(err)
	}
	if err := costSchema(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// Each dbcost variant's rows, index entries and round trips per commit are
// what it writes and sends: one group commit of each on a migrated
// database, the rows every table gained, each times the table's indexes
// (information_schema, so an index a migration adds is counted without
// anyone remembering to), and the statements between BEGIN and COMMIT.
func TestCostVariantsCountWhatTheyWrite(t *testing.T) {
	ctx := context.Background()
	db := costDB(t)
	indexes := map[string]int{}
	rows, err := db.QueryContext(ctx, `SELECT t.table_name, COUNT(DISTINCT s.index_name)
		FROM information_schema.tables t LEFT JOIN information_schema.statistics s
		  ON s.table_schema = t.table_schema AND s.table_name = t.table_name
		WHERE t.table_schema = DATABASE() AND t.table_type = 'BASE TABLE' GROUP BY t.table_name`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		indexes[name] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	_ = rows.Close()
	count := func() map[string]int {
		out := map[string]int{}
		for name := range indexes {
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+name+"`").Scan(&n); err != nil {
				t.Fatal(err)
			}
			out[name] = n
		}
		return out
	}
	const sales = 3
	for _, v := range costVariants() {
		before := count()
		var own *prepconn.Conn
		if v.mode == ownConn {
			own = prepconn.New(db, prepconn.Config{})
		}
		ids := make([]string, sales)
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7()).String()
		}
		statements := 0
		err := costCommit(ctx, &costRig{db: db}, v, own, ids, func(tx costTx) costTx { return countingTx{tx, &statements} })
		if own != nil {
			_ = own.Close()
		}
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		var gotRows, gotEntries int
		for name, n := range count() {
			d := n - before[name]
			if d%sales != 0 {
				t.Errorf("%s: %s gained %d rows for %d sales", v.name, name, d, sales)
			}
			gotRows += d / sales
			gotEntries += d / sales * indexes[name]
		}
		trips := statements + 2 // BEGIN, COMMIT
		if v.mode == twoStepTx {
			trips++
		}
		if gotRows != v.rows || gotEntries != v.entries || trips != v.trips {
			t.Errorf("%s: says %d rows, %d index entries per sale, %d round trips per commit; writes %d, %d, sends %d",
				v.name, v.rows, v.entries, v.trips, gotRows, gotEntries, trips)
		}
	}

	// Between variants every table the variants wrote is emptied, the
	// SKUs' and the migrations' kept, so each variant starts from the same
	// tables.
	full := count()
	if full["orders"] == 0 || full["d4_sales"] == 0 || full["floor_sales"] == 0 {
		t.Fatalf("the variants wrote nothing to empty: %v", full)
	}
	if err := emptyCostTables(ctx, db); err != nil {
		t.Fatal(err)
	}
	for name, n := range count() {
		want := 0
		if name == "skus" || name == "goose_db_version" {
			want = full[name]
		}
		if n != want {
			t.Errorf("%s: %d rows after emptying, want %d", name, n, want)
		}
	}
}

// The target's table divides each round by its own floor: a loaded round
// raises the floor and the variant together, so the median of the ratios
// is 2.50 here where the ratio of the medians would be 26/10 = 2.6.
func TestCostTargetsDividesByTheSameRoundsFloor(t *testing.T) {
	vs := []costVariant{{name: "floor", entries: 1}, {name: "sale", entries: 5}, {name: "unmeasured", entries: 3}}
	perSale := [][]float64{{10, 20, 10}, {25, 40, 26}, nil}
	ratios := [][]float64{{1, 1, 1}, {2.5, 2, 2.6}, nil}
	got := costTargets(vs, perSale, ratios)
	for _, want := range []string{
		"| floor | 1 | 10.0 | 1.00× (1.00–1.00) | yes | yes |",
		"| sale | 5 | 26.0 | 2.50× (2.00–2.60) | yes | yes |",
		"| unmeasured | 3 | – | – | – | – |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
}

// The server's state printed beside the dbcost table names the buffer pool
// the server runs with and how much InnoDB data this run's schema holds.
func TestServerStateNamesThePoolAndTheTables(t *testing.T) {
	ctx := context.Background()
	db := costDB(t)
	var pool int64
	if err := db.QueryRowContext(ctx, `SELECT @@innodb_buffer_pool_size`).Scan(&pool); err != nil {
		t.Fatal(err)
	}
	got := serverState(ctx, db)
	want := fmt.Sprintf("buffer pool %.0f MiB (", float64(pool)/(1<<20))
	if !strings.Contains(got, want) || !strings.Contains(got, "MiB in this run's schema") {
		t.Fatalf("serverState = %q, want it to name %q and this schema's tables", got, want)
	}
	var here float64
	if _, err := fmt.Sscanf(got[strings.Index(got, "InnoDB tables ")+len("InnoDB tables "):], "%f", &here); err != nil || here <= 0 {
		t.Fatalf("this schema's tables: %v MiB (%v) in %q; the cost schema has tables", here, err, got)
	}
}
