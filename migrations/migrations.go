// Package migrations holds the numbered up/down SQL schema, embedded in the
// binary and applied with goose: mysql/ for the real database, sqlite/ (the
// same tables and rules) for the embedded default.
//
// MySQL commits DDL implicitly, so a migration that fails half way is not
// rolled back; each file therefore changes one table.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
)

//go:embed mysql/*.sql sqlite/*.sql
var files embed.FS

// Dialect picks the migration set.
type Dialect string

const (
	MySQL  Dialect = "mysql"
	SQLite Dialect = "sqlite"
)

// Provider returns a goose provider over the embedded migrations of d.
func Provider(db *sql.DB, d Dialect) (*goose.Provider, error) {
	sub, err := fs.Sub(files, string(d))
	if err != nil {
		return nil, err
	}
	if d == SQLite {
		return goose.NewProvider(goose.DialectSQLite3, db, sub, goose.WithGoMigrations(countKindSQLite))
	}
	return goose.NewProvider(goose.DialectMySQL, db, sub, goose.WithGoMigrations(exactNames))
}

// Up applies every pending migration.
func Up(ctx context.Context, db *sql.DB, d Dialect) error {
	p, err := Provider(db, d)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// Down rolls the newest applied migration back and returns its version (0
// when none was applied).
func Down(ctx context.Context, db *sql.DB, d Dialect) (int64, error) {
	p, err := Provider(db, d)
	if err != nil {
		return 0, err
	}
	res, err := p.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("migrate down: %w", err)
	}
	return res.Source.Version, nil
}

// DownAll rolls every applied migration back.
func DownAll(ctx context.Context, db *sql.DB, d Dialect) error {
	p, err := Provider(db, d)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}
