package rawtx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/rawtx"
	"github.com/acme/inventory/testkit/testenv"
)

// A transaction past GORM ends as GORM's Transaction ends one: committed
// when fn succeeds, rolled back when it fails or panics (the panic goes
// on); a duplicate key is gorm.ErrDuplicatedKey, as GORM's translation
// made it; and Observe sees each statement (on any session of the handle)
// until stopped. On MariaDB and on the embedded SQLite.
func TestRunEndsAndTranslatesAsGORM(t *testing.T) {
	for name, open := range map[string]func(testing.TB) *gorm.DB{
		"mariadb":  testenv.MySQL,
		"embedded": func(t testing.TB) *gorm.DB { db, _ := testenv.Embedded(t); return db },
	} {
		t.Run(name, func(t *testing.T) {
			db := open(t)
			ctx := context.Background()
			count := func() int64 {
				var n int64
				require.NoError(t, db.Raw(`SELECT COUNT(*) FROM skus`).Scan(&n).Error)
				return n
			}
			var seen []rawtx.Statement
			stop := rawtx.Observe(db.Session(&gorm.Session{NewDB: true}), func(s rawtx.Statement) { seen = append(seen, s) })
			insert := func(tx *rawtx.Tx, sku string) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO skus (sku, on_hand) VALUES (?, ?)`, sku, 1)
				return err
			}
			require.NoError(t, rawtx.Run(ctx, db, func(tx *rawtx.Tx) error { return insert(tx, "A") }))
			require.EqualValues(t, 1, count())
			require.Len(t, seen, 1)
			require.Equal(t, `INSERT INTO skus (sku, on_hand) VALUES (?, ?)`, seen[0].SQL)
			require.Equal(t, []any{"A", 1}, seen[0].Args)
			require.NoError(t, seen[0].Err)

			err := rawtx.Run(ctx, db, func(tx *rawtx.Tx) error {
				require.NoError(t, insert(tx, "B"))
				return insert(tx, "A")
			})
			require.ErrorIs(t, err, gorm.ErrDuplicatedKey)
			require.ErrorIs(t, seen[len(seen)-1].Err, gorm.ErrDuplicatedKey, "the observer sees the error as returned")
			require.EqualValues(t, 1, count(), "B rolled back with the failed transaction")

			boom := errors.New("boom")
			require.PanicsWithValue(t, boom, func() {
				_ = rawtx.Run(ctx, db, func(tx *rawtx.Tx) error {
					require.NoError(t, insert(tx, "C"))
					panic(boom)
				})
			})
			require.EqualValues(t, 1, count(), "C rolled back when fn panicked")

			stop()
			n := len(seen)
			require.NoError(t, rawtx.Run(ctx, db, func(tx *rawtx.Tx) error { return insert(tx, "D") }))
			require.Len(t, seen, n, "no statement observed once stopped")
			require.EqualValues(t, 2, count())
		})
	}
}
