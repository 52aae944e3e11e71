// Package migrations holds the numbered up/down SQL schema, embedded in the
// binary and applied with goose.
//
// MySQL commits DDL implicitly, so a migration that fails half way is not
// rolled back; each file therefore changes one table.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
)

//go:embed mysql/*.sql
var files embed.FS

// Provider returns a goose provider over the embedded MySQL migrations.
func Provider(db *sql.DB) (*goose.Provider, error) {
	sub, err := fs.Sub(files, "mysql")
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectMySQL, db, sub)
}

// Up applies every pending migration.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := Provider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// DownAll rolls every applied migration back.
func DownAll(ctx context.Context, db *sql.DB) error {
	p, err := Provider(db)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}
