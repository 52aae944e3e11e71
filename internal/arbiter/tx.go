package arbiter

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/acme/inventory/stock"
)

// Under contention InnoDB picks deadlock victims (the applier's reservation
// UPDATE and a group commit's inserts can wait on each other's gap locks);
// the victim rolled back entirely, so running it again is safe. Ten attempts
// with a growing, jittered pause make a caller see one only when the
// database is stuck, not merely busy.
func RetryDeadlock[T any](fn func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		v, err := fn()
		if attempt < 10 && IsDeadlock(err) {
			d := time.Duration(attempt+1) * 5 * time.Millisecond
			time.Sleep(d/2 + rand.N(d))
			continue
		}
		return v, err
	}
}

// IsDeadlock recognises a transaction MySQL chose as a deadlock victim, that
// waited too long for a lock, or (MariaDB's innodb_snapshot_isolation) that
// would update a row changed since its snapshot: safe to run again.
func IsDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205 || me.Number == 1020)
}

// IsDuplicate recognises an INSERT refused by a unique key.
func IsDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062 || errors.Is(err, gorm.ErrDuplicatedKey)
}

// InitFunc is the stock.InitFunc over db: the arbiter numbers a new Redis
// epoch for sku and reads on_hand - reserved and the seq, and Redis is
// written while the row is locked. Its cost is one row, whatever the SKU's
// history. The epoch is committed even when the Redis write fails, so an
// epoch is never used twice.
func InitFunc(db *gorm.DB) stock.InitFunc {
	return func(ctx context.Context, sku string, write func(stock.Level) error) error {
		var werr error
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
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
