package testrig

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"time"

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
	held   atomic.Pointer[chan struct{}] // closed once the next batch's answers are held
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
	// The batch's last statement is its movements' INSERT (numbered from
	// the fences' read before it), or a campaign's pool's read (for a sale
	// that crosses no threshold, which would write its events after it: no
	// SKU sold out, not a campaign's first sale): from then on the server's
	// answers are held, and the COMMIT that follows reaches the server and
	// commits unanswered.
	stop := rawtx.Observe(db, func(s rawtx.Statement) {
		last := strings.HasPrefix(s.SQL, "INSERT INTO stock_movements") || strings.HasPrefix(s.SQL, "SELECT r.result AS seq")
		if last && s.Err == nil && u.armed.CompareAndSwap(true, false) {
			require.NoError(t, u.link.HoldAnswers())
			u.lost.Store(true)
			if ch := u.held.Load(); ch != nil {
				close(*ch)
			}
		}
	})
	t.Cleanup(stop)
	return u
}

// LoseNextAnswer makes the next batch's COMMIT go unanswered. The channel
// it returns is closed when that batch's last statement before its COMMIT
// was answered and the answers are held from then on.
func (u *UnansweredCommits) LoseNextAnswer() <-chan struct{} {
	ch := make(chan struct{})
	u.held.Store(&ch)
	u.armed.Store(true)
	return ch
}

// AnswerLost is a context for a write whose COMMIT's answer is lost: it
// ends half a second after that batch's answers are held (the writer sends
// the COMMIT right after the statement that armed the hold), so the writer
// gives up on an answer that never comes however long the write took to
// get there on a busy machine.
func (u *UnansweredCommits) AnswerLost(parent context.Context) (context.Context, context.CancelFunc) {
	held := u.LoseNextAnswer()
	// Bounded all the same: a batch that never reaches the hold fails its
	// test in seconds instead of hanging it.
	ctx, cancel := context.WithTimeout(parent, 10*time.Second)
	go func() {
		select {
		case <-held:
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx, cancel
}

// Heal lets the server's answers through again, once one was lost.
func (u *UnansweredCommits) Heal() error {
	if !u.lost.Load() {
		return errNotLost
	}
	return u.link.Heal()
}

var errNotLost = errors.New("testrig: no commit's answer was lost")
