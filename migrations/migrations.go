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

// Up applies every pending migration. A new database (none applied yet)
// is contracted too: no node of an older release can be serving it.
func Up(ctx context.Context, db *sql.DB, d Dialect) error {
	p, err := Provider(db, d)
	if err != nil {
		return err
	}
	before, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	if before == 0 {
		_, err = Contract(ctx, db, d)
	}
	return err
}

// Step is one migration rolled back: an expand migration's version, or a
// contract step's.
type Step struct {
	Version  int64
	Contract bool
}

func (s Step) String() string {
	if s.Contract {
		return fmt.Sprintf("contract step %d", s.Version)
	}
	return fmt.Sprintf("version %d", s.Version)
}

// Down rolls the newest applied step back and returns it (the zero Step
// when none was applied): a contract step while one is applied, the
// contract being newer than every expand migration it needs.
func Down(ctx context.Context, db *sql.DB, d Dialect) (Step, error) {
	c, err := contractProvider(db, d)
	if err != nil {
		return Step{}, err
	}
	res, err := c.Down(ctx)
	if err == nil {
		return Step{Version: res.Source.Version, Contract: true}, nil
	}
	if !errors.Is(err, goose.ErrNoNextVersion) {
		return Step{}, fmt.Errorf("migrate down: %w", err)
	}
	p, err := Provider(db, d)
	if err != nil {
		return Step{}, err
	}
	res, err = p.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		return Step{}, nil
	}
	if err != nil {
		return Step{}, fmt.Errorf("migrate down: %w", err)
	}
	return Step{Version: res.Source.Version}, nil
}

// DownAll rolls every applied step back, the contract's first.
func DownAll(ctx context.Context, db *sql.DB, d Dialect) error {
	c, err := contractProvider(db, d)
	if err != nil {
		return err
	}
	if _, err := c.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	p, err := Provider(db, d)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}
