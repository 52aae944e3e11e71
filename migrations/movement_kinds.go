package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/pressly/goose/v3"
)

// countKindSQLite is migration 39 on SQLite (the embedded default):
// mysql/00039's COUNT movement kind. SQLite cannot change a CHECK in
// place, and rebuilding stock_movements would have to name every column
// (another migration may add one), so the stored definition is edited
// and the schema's version bumped, the procedure SQLite documents for a
// change that leaves the stored rows valid ("Making Other Kinds Of Table
// Schema Changes", https://sqlite.org/lang_altertable.html): every
// connection reads the new definition at its next statement.
var countKindSQLite = goose.NewGoMigration(39,
	&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
		return editMovementsCheck(ctx, tx, movementKinds, movementKinds+", 'COUNT'")
	}},
	&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE stock_movements SET kind = 'CORRECTION' WHERE kind = 'COUNT'`); err != nil {
			return err
		}
		return editMovementsCheck(ctx, tx, movementKinds+", 'COUNT'", movementKinds)
	}},
)

// movementKinds are the kinds stock_movements' CHECK allowed before 39, as
// sqlite/00013 wrote them.
const movementKinds = "'RESERVE', 'RELEASE', 'SALE', 'RESTOCK', 'CORRECTION', 'REFUND', 'SET'"

// editMovementsCheck replaces the CHECK's list of kinds from with to in
// stock_movements' stored definition, in the migration's transaction (one
// connection: writable_schema is the connection's), and bumps
// schema_version.
func editMovementsCheck(ctx context.Context, conn *sql.Tx, from, to string) error {
	var def string
	if err := conn.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'stock_movements'`).Scan(&def); err != nil {
		return err
	}
	if strings.Count(def, "IN ("+from+")") != 1 {
		return fmt.Errorf("migrate: stock_movements' CHECK does not list the kinds %s: %s", from, def)
	}
	var version int64
	if err := conn.QueryRowContext(ctx, `PRAGMA schema_version`).Scan(&version); err != nil {
		return err
	}
	for _, stmt := range []string{
		`PRAGMA writable_schema = ON`,
		`UPDATE sqlite_schema SET sql = '` + strings.ReplaceAll(strings.Replace(def, "IN ("+from+")", "IN ("+to+")", 1), "'", "''") +
			`' WHERE type = 'table' AND name = 'stock_movements'`,
		fmt.Sprintf(`PRAGMA schema_version = %d`, version+1),
		`PRAGMA writable_schema = OFF`,
	} {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrate: stock_movements' CHECK: %w", err)
		}
	}
	var ok string
	if err := conn.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		return fmt.Errorf("migrate: stock_movements' CHECK: integrity check says %q (%v)", ok, err)
	}
	return nil
}
