package arbiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/acme/inventory"
	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"
)

// Under contention InnoDB picks deadlock victims (the applier's reservation
// UPDATE and a group commit's inserts can wait on each other's gap locks;
// two creates of new SKUs both hold the gap their inserts need); the victim
// rolled back entirely, so running it again is safe. Ten attempts with a
// growing, jittered pause make a caller see one only when the database is
// stuck, not merely busy; the pauses end with ctx (the request's deadline),
// and the last error is returned then.
func RetryDeadlock[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		v, err := fn()
		if attempt < 10 && Retryable(err) {
			d := time.Duration(attempt+1) * 5 * time.Millisecond
			t := time.NewTimer(d/2 + rand.N(d))
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
			}
		}
		return v, err
	}
}

// Transact runs fn in a transaction on db under ctx, again (RetryDeadlock)
// when the database rolled it back as a deadlock victim.
func Transact(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error) error {
	_, err := RetryDeadlock(ctx, func() (struct{}, error) {
		return struct{}{}, db.WithContext(ctx).Transaction(fn)
	})
	return err
}

// Retryable recognises a transaction the database rolled back whole that
// may succeed when run again: a deadlock victim, one that waited too long
// for a lock, one that (MariaDB's innodb_snapshot_isolation) would update
// a row changed since its snapshot, or one that lost a race to insert a
// row (errInsertRaced: run again, it finds the row).
func Retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205 || me.Number == 1020) ||
		errors.Is(err, errInsertRaced) || errors.Is(err, errLimitChanged)
}

// errInsertRaced is an insert refused because a transaction that read no
// such row inserted it first (under READ COMMITTED no gap lock keeps it
// out): the whole transaction is to run again.
var errInsertRaced = errors.New("arbiter: another transaction inserted the row first")

// InsertRaced marks err, an insert refused by a unique key that a
// concurrent transaction's insert took first, as Retryable: the
// transaction runs again and finds that row.
func InsertRaced(err error) error { return fmt.Errorf("%w: %w", errInsertRaced, err) }

// IsDuplicate recognises an INSERT refused by a unique key.
func IsDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062 || errors.Is(err, gorm.ErrDuplicatedKey)
}

// InitFunc is the inventory.InitFunc over db: the arbiter numbers a new Redis
// epoch for sku and reads on_hand - reserved and the seq, and Redis is
// written while the row is locked. Its cost is one row, whatever the SKU's
// history. The epoch is committed even when the Redis write fails, so an
// epoch is never used twice.
func InitFunc(db *gorm.DB) inventory.InitFunc {
	return func(ctx context.Context, sku string, write func(inventory.Baseline) error) error {
		var werr error
		err := Transact(ctx, db, func(tx *gorm.DB) error {
			werr = nil
			lv, err := In(tx).NewEpoch(sku)
			if err != nil {
				return err
			}
			werr = write(lv)
			return nil
		})
		return errors.Join(err, werr)
	}
}
