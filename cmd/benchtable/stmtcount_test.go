package main

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"testing"

	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory/testkit/testenv"
)

func TestStatementShape(t *testing.T) {
	for sql, want := range map[string]string{
		"SELECT * FROM `campaigns` WHERE id = 'c' LIMIT 1":                             "SELECT `campaigns`",
		"UPDATE `orders` SET `expires_at`='x' WHERE id = 'o'":                          "UPDATE `orders`",
		"INSERT INTO `orders` (`id`) VALUES ('o')":                                     "INSERT `orders`",
		"SELECT state, token = 'c:x' AS pool, SUM(qty) AS qty FROM stock_reservations": "SELECT stock_reservations",
		"COMMIT": "COMMIT",
		"":       "?",
	} {
		if got := statementShape(sql); got != want {
			t.Errorf("%q: %q, want %q", sql, got, want)
		}
	}
}

// Only the statements of requests served by serveTagged are counted as the
// requests', only while a window is open, and a transaction is seen as one.
func TestStatementCounterCountsTaggedRequests(t *testing.T) {
	dsn := testenv.MySQLDatabase(t) // a test's own, not the bench's
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("CREATE TABLE bench_count (id INT PRIMARY KEY, n INT NOT NULL)").Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("INSERT INTO bench_count VALUES (1, 0)").Error; err != nil {
		t.Fatal(err)
	}
	c := countStatements(db)
	base, stop := serveTagged(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int
		q := db.WithContext(r.Context())
		if err := q.Raw("SELECT 1").Scan(&n).Error; err != nil {
			t.Error(err)
		}
		if err := q.Transaction(func(tx *gorm.DB) error {
			return tx.Exec("SELECT 1 FROM DUAL").Error
		}); err != nil {
			t.Error(err)
		}
		// An UPDATE in GORM's default transaction.
		if err := q.Table(cfg.DBName+".bench_count").Where("id = ?", 1).Update("n", gorm.Expr("n + 1")).Error; err != nil {
			t.Error(err)
		}
	}))
	defer stop()
	get := func() {
		resp, err := http.Get(base + "/")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	get() // outside a window: not counted
	done := c.window()
	get()
	get()
	var n int
	if err := db.WithContext(context.Background()).Raw("SELECT 2").Scan(&n).Error; err != nil { // untagged
		t.Fatal(err)
	}
	got := done()
	get() // closed again
	if got.tagged != 6 || got.untagged != 1 || got.txs != 4 {
		t.Fatalf("tagged %d, untagged %d, transactions %d; want 6, 1, 4 (%s)", got.tagged, got.untagged, got.txs, got.describe())
	}
	if d, want := got.describe(), "2 SELECT, 2 SELECT DUAL, 2 UPDATE `"+cfg.DBName+"`.`bench_count`"; d != want {
		t.Fatalf("shapes %q, want %q", d, want)
	}
}
