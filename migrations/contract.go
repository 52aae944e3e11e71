package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/pressly/goose/v3"
)

// The contract is the schema steps that remove what an older release
// still uses, so they run only once no node of such a release serves:
// `inventoryd migrate contract`, after a fleet is rolled (docs/
// operations.md, "Upgrading a fleet"). They are a numbered set of their
// own, recorded in contractTable, so that `migrate` (the expand set)
// never runs one by itself on a database a fleet serves, and expand
// migrations written later keep their own numbers.
//
// A new database is the exception: nothing older can be serving it, so
// Up contracts it at once (see Up).
const contractTable = "goose_contract_version"

// contractMySQL are the contract's steps on MySQL.
//
//  1. Every order with an Idempotency-Key gets its row in idempotency_keys
//     (migration 44's table). Releases from 44 on write that row in the
//     sale's commit and find a key there first; a release before 44 wrote
//     the key only in the order's row, and its orders are found through
//     orders_idempotency. Copied in pages by primary key, each a plain
//     read and an INSERT IGNORE, so no lock is held on orders while sales
//     and the projector write it.
//  2. orders_idempotency is dropped: one index entry less for every order
//     written. idempotency_keys' primary key is what makes a key's retry a
//     duplicate for every release from 44 on. The column stays (a node
//     selling with INSERT the order in the sale's commit still fills it);
//     nothing reads it once the index is gone (order.Service's old-order
//     fallback reads only through this index, and stops at its absence).
var contractMySQL = []*goose.Migration{
	goose.NewGoMigration(1,
		&goose.GoFunc{RunDB: backfillKeys},
		nil), // down: the rows stay, saying what the orders' column says
	goose.NewGoMigration(2,
		&goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error {
			_, err := db.ExecContext(ctx, `ALTER TABLE orders DROP KEY orders_idempotency`)
			return err
		}},
		&goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error {
			_, err := db.ExecContext(ctx, `ALTER TABLE orders ADD UNIQUE KEY orders_idempotency (user_id, idempotency_key)`)
			return err
		}}),
}

// contractSQLite is the contract on SQLite (the embedded default, one
// process, which contracts at every start): step 1 alone, one statement
// in the step's transaction (the embedded default has one connection,
// which goose holds while it runs a step). Its orders keep their UNIQUE
// (user_id, idempotency_key): SQLite cannot drop a table's inline
// constraint without rebuilding the table, and the embedded default is
// not where a sale's index entries are counted.
var contractSQLite = []*goose.Migration{
	goose.NewGoMigration(1,
		&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO idempotency_keys (user_id, idempotency_key, order_id, created_at)
				SELECT user_id, idempotency_key, id, created_at FROM orders WHERE idempotency_key IS NOT NULL`)
			return err
		}},
		nil),
}

// keysPage is how many orders each page of the keys' backfill reads.
const keysPage = 1000

// backfillKeys copies every order's Idempotency-Key into idempotency_keys,
// a page of orders at a time in primary-key order.
func backfillKeys(ctx context.Context, db *sql.DB) error {
	after := ""
	for {
		rows, err := db.QueryContext(ctx, `SELECT id, user_id, idempotency_key, created_at FROM orders
			WHERE id > ? ORDER BY id LIMIT ?`, after, keysPage)
		if err != nil {
			return err
		}
		var values []string
		var args []any
		n := 0
		for rows.Next() {
			var id, user string
			var key sql.NullString
			var created any
			if err := rows.Scan(&id, &user, &key, &created); err != nil {
				rows.Close()
				return err
			}
			n, after = n+1, id
			if key.Valid {
				values = append(values, "(?, ?, ?, ?)")
				args = append(args, user, key.String, id, created)
			}
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		if len(values) > 0 {
			if _, err := db.ExecContext(ctx, `INSERT IGNORE INTO idempotency_keys (user_id, idempotency_key, order_id, created_at) VALUES `+
				strings.Join(values, ", "), args...); err != nil {
				return fmt.Errorf("idempotency_keys from orders after %q: %w", after, err)
			}
		}
		if n < keysPage {
			return nil
		}
	}
}

// contractProvider is the goose provider over d's contract steps.
func contractProvider(db *sql.DB, d Dialect) (*goose.Provider, error) {
	steps, dialect := contractMySQL, goose.DialectMySQL
	if d == SQLite {
		steps, dialect = contractSQLite, goose.DialectSQLite3
	}
	return goose.NewProvider(dialect, db, nil, goose.WithTableName(contractTable), goose.WithGoMigrations(steps...))
}

// Contract applies every contract step not yet applied, once every expand
// migration is: run it after no node of a release older than this
// binary's serves the database. It returns how many steps it applied.
func Contract(ctx context.Context, db *sql.DB, d Dialect) (int, error) {
	p, err := Provider(db, d)
	if err != nil {
		return 0, err
	}
	if pending, err := p.HasPending(ctx); err != nil {
		return 0, err
	} else if pending {
		return 0, errors.New("migrate contract: migrations are pending; run migrate (up) first, then roll the fleet")
	}
	c, err := contractProvider(db, d)
	if err != nil {
		return 0, err
	}
	res, err := c.Up(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate contract: %w", err)
	}
	return len(res), nil
}

// contracted is the newest contract step applied (0: none).
func contracted(ctx context.Context, db *sql.DB, d Dialect) (int64, error) {
	c, err := contractProvider(db, d)
	if err != nil {
		return 0, err
	}
	return c.GetDBVersion(ctx)
}
