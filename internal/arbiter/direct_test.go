package arbiter_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/rawtx"
)

// The suffixes of the twin SKUs, tokens and campaigns of either side.
const gside, rside = "_gside", "_rside"

// Reserve past GORM (OnConn on a rawtx transaction: the group commit's)
// sends exactly the statements it sends through GORM (In), in the same
// order, and answers the same: a sale counted against a buyer's limit, a
// cart of two SKUs, a refusal, an unknown SKU, a buyer over the limit, a
// campaign's first sale (its campaign.started event), a sale that crosses
// the low-stock threshold. Each runs once on either side, on twin SKUs.
func TestReservePastGORMSendsWhatGORMSent(t *testing.T) {
	s := newStmts(t)
	starts := time.Now().Add(-time.Minute)
	for _, side := range []string{gside, rside} {
		s.put("L"+side, 10, 2)
		s.put("M"+side, 10, 0)
		s.setSKU("E"+side, arbiter.Settings{OnHand: 10, LowStockThreshold: 8})
		s.put("P"+side, 20, 0)
		require.NoError(t, s.putCampaign(campaign("camp"+side, "P"+side, 5, 1, starts)))
	}
	type outcome struct {
		statements []string
		fences     map[string]arbiter.Fence
		err        string
	}
	// run reserves holds (their SKUs, tokens and campaigns named with
	// side's suffix) on side, and what it sent and answered, the suffix
	// taken out.
	run := func(side string, holds func(side string) []arbiter.Hold) outcome {
		var o outcome
		seen := func(sql string) { o.statements = append(o.statements, sql) }
		var fences map[string]arbiter.Fence
		var err error
		if side == gside {
			name := "sent:" + t.Name()
			cb := s.DB.Callback()
			record := func(tx *gorm.DB) { seen(tx.Statement.SQL.String()) }
			require.NoError(t, cb.Raw().After("gorm:raw").Register(name, record))
			require.NoError(t, cb.Row().After("gorm:row").Register(name, record))
			require.NoError(t, cb.Query().After("gorm:query").Register(name, record))
			fences, err = s.reserve(holds(side)...)
			_ = cb.Raw().Remove(name)
			_ = cb.Row().Remove(name)
			_ = cb.Query().Remove(name)
		} else {
			stop := rawtx.Observe(s.DB, func(st rawtx.Statement) { seen(st.SQL) })
			ctx := context.Background()
			err = rawtx.Run(ctx, s.DB, func(tx *rawtx.Tx) error {
				var err error
				fences, err = arbiter.OnConn(ctx, tx, tx.Dialect()).Reserve(holds(side))
				return err
			})
			stop()
		}
		o.fences = map[string]arbiter.Fence{}
		for k, f := range fences {
			o.fences[strings.TrimSuffix(k, side)] = f
		}
		if err != nil {
			o.err = strings.ReplaceAll(fmt.Sprintf("%T %v", err, err), side, "")
		}
		return o
	}
	for _, c := range []struct {
		name  string
		holds func(side string) []arbiter.Hold
		fails bool
	}{
		{"a sale counted against its buyer", func(x string) []arbiter.Hold { return []arbiter.Hold{holdBy("t1"+x, "L"+x, 1, "u1")} }, false},
		{"a cart of two SKUs", func(x string) []arbiter.Hold {
			return []arbiter.Hold{holdBy("t2"+x, "M"+x, 2, "u1"), holdBy("t2"+x, "L"+x, 1, "u2")}
		}, false},
		{"a buyer over the limit", func(x string) []arbiter.Hold { return []arbiter.Hold{holdBy("t3"+x, "L"+x, 2, "u1")} }, true},
		{"a refusal", func(x string) []arbiter.Hold { return []arbiter.Hold{hold("t4"+x, "M"+x, 9)} }, true},
		{"an unknown SKU", func(x string) []arbiter.Hold { return []arbiter.Hold{hold("t5"+x, "NOPE"+x, 1)} }, true},
		{"a campaign's first sale", func(x string) []arbiter.Hold { return []arbiter.Hold{sale("t6"+x, "P"+x, "camp"+x, 1, "u1")} }, false},
		{"a sale across the low-stock threshold", func(x string) []arbiter.Hold { return []arbiter.Hold{hold("t7"+x, "E"+x, 3)} }, false},
	} {
		g, r := run(gside, c.holds), run(rside, c.holds)
		require.NotEmpty(t, g.statements, c.name)
		require.Equal(t, g.statements, r.statements, "%s: the statements sent", c.name)
		require.Equal(t, c.fails, g.err != "", "%s: %s", c.name, g.err)
		require.Equal(t, g.err, r.err, "%s: the error", c.name)
		if !c.fails {
			require.Equal(t, g.fences, r.fences, "%s: the fences", c.name)
		}
	}
	for _, x := range []string{"L", "M", "E", "P"} {
		require.Equal(t, s.SKU(x+gside).Reserved, s.SKU(x+rside).Reserved, x)
	}
	require.Len(t, s.campaignEvents("P"+rside, 0), len(s.campaignEvents("P"+gside, 0)))
	require.NotEmpty(t, s.campaignEvents("P"+rside, 0), "the first sale's campaign.started")
}
