// Package smoke proves that the suite talks to each real server: a Lua script
// by EVALSHA on Redis, a GORM transaction on MariaDB. The RocketMQ smoke test
// lives in package mq beside the adapter it exercises.
package smoke

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/testkit/testenv"
)

func TestRedisEvalSha(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	// A script of this run's own (a nonce in a comment), so the server has
	// never seen it: SCRIPT FLUSH would empty the cache of every other test
	// process sharing the server.
	script := redis.NewScript(fmt.Sprintf("-- %d\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])", time.Now().UnixNano()))

	// Script.Run tries EVALSHA first and loads the script on NOSCRIPT.
	exists, err := script.Exists(ctx, rdb).Result()
	require.NoError(t, err)
	require.Equal(t, []bool{false}, exists)
	n, err := script.Run(ctx, rdb, []string{"smoke:{k}"}, 5).Int64()
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	exists, err = script.Exists(ctx, rdb).Result()
	require.NoError(t, err)
	require.Equal(t, []bool{true}, exists, "the script is cached on the server")
	n, err = rdb.EvalSha(ctx, script.Hash(), []string{"smoke:{k}"}, 2).Int64()
	require.NoError(t, err)
	require.EqualValues(t, 7, n)

	info, err := rdb.Info(ctx, "server").Result()
	require.NoError(t, err)
	require.Contains(t, info, "redis_version:")
}

type smokeRow struct {
	ID    int `gorm:"primaryKey"`
	Stock int
}

func TestMariaDBTransaction(t *testing.T) {
	db := testenv.MySQL(t)
	require.NoError(t, db.Exec(`CREATE TABLE smoke_rows (id INT PRIMARY KEY, stock INT NOT NULL) ENGINE=InnoDB`).Error)
	require.NoError(t, db.Create(&smokeRow{ID: 1, Stock: 10}).Error)

	// A failed transaction leaves nothing behind.
	boom := errors.New("boom")
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&smokeRow{}).Where("id = ?", 1).Update("stock", gorm.Expr("stock - ?", 3)).Error; err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	var row smokeRow
	require.NoError(t, db.First(&row, 1).Error)
	require.Equal(t, 10, row.Stock)

	// A committed one is visible, and InnoDB row locking works.
	err = db.Transaction(func(tx *gorm.DB) error {
		var locked smokeRow
		if err := tx.Raw(`SELECT id, stock FROM smoke_rows WHERE id = 1 FOR UPDATE`).Scan(&locked).Error; err != nil {
			return err
		}
		return tx.Model(&smokeRow{}).Where("id = ?", 1).Update("stock", locked.Stock-3).Error
	})
	require.NoError(t, err)
	require.NoError(t, db.First(&row, 1).Error)
	require.Equal(t, 7, row.Stock)

	var version string
	require.NoError(t, db.Raw(`SELECT VERSION()`).Scan(&version).Error)
	require.Contains(t, version, "MariaDB")
}
