package testrig

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acme/inventory/internal/groupcommit"
	"github.com/acme/inventory/internal/mysqlconn"
	"github.com/acme/inventory/internal/rawtx"
	"github.com/acme/inventory/testkit/faultnet"
	"github.com/acme/inventory/testkit/testenv"
)

// UnansweredCommits is a group commit on the rig's database whose
// connections pass a link of their own (the rest of the rig's do not),
// which can lose the answer to its next COMMIT: the database commits, the
// writer never hears so and gives up at its callers' deadline, so the
// caller is told the outcome is unknown (groupcommit.ErrUnknownOutcome)
// while the rows exist. What the caller does next (a realign, an undo)
// reaches the database past the link.
type UnansweredCommits struct {
	Writer *groupcommit.Writer
	link   *faultnet.Link
	armed  atomic.Bool
	lost   atomic.Bool
}

// UnansweredCommits builds one on the rig's MariaDB (not on the embedded
// stand-ins).
func (r *Rig) UnansweredCommits() *UnansweredCommits {
	t := r.T
	t.Helper()
	ctx := context.Background()
	var name string
	require.NoError(t, r.DB.Raw(`SELECT DATABASE()`).Scan(&name).Error)
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
	require.NoError(t, err)
	cfg.DBName = name
	require.NoError(t, mysqlconn.Prepare(ctx, cfg))
	u := &UnansweredCommits{link: testenv.NewLink(t, cfg.Addr)}
	cfg.Addr = u.link.Addr()
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	sqlDB := sql.OpenDB(connector)
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard, TranslateError: true})
	require.NoError(t, err)
	u.Writer = groupcommit.New(db)
	t.Cleanup(func() { _ = u.Writer.Close() })
	// The batch's last statement is its read of the SKUs' fences, or of a
	// campaign's pool's (for a sale that crosses no threshold, which would
	// write its events after it: no SKU sold out, not a campaign's first
	// sale): from then on the server's answers are held, and the COMMIT
	// that follows reaches the server and commits unanswered.
	stop := rawtx.Observe(db, func(s rawtx.Statement) {
		last := strings.HasPrefix(s.SQL, "SELECT sku, seq, redis_epoch") || strings.HasPrefix(s.SQL, "SELECT r.result AS seq")
		if last && s.Err == nil && u.armed.CompareAndSwap(true, false) {
			require.NoError(t, u.link.HoldAnswers())
			u.lost.Store(true)
		}
	})
	t.Cleanup(stop)
	return u
}

// LoseNextAnswer makes the next batch's COMMIT go unanswered.
func (u *UnansweredCommits) LoseNextAnswer() { u.armed.Store(true) }

// Heal lets the server's answers through again, once one was lost.
func (u *UnansweredCommits) Heal() error {
	if !u.lost.Load() {
		return errNotLost
	}
	return u.link.Heal()
}

var errNotLost = errors.New("testrig: no commit's answer was lost")
