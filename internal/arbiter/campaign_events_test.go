package arbiter_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// cev is an event as the campaign tests compare it: its type, its
// campaign ("" for a SKU's) and the levels it carries.
type cev struct {
	Type, Campaign              string
	OnHand, Reserved, Available int64
}

// campaignEvents reads sku's events in seq order (checking the seqs run
// 1, 2, 3, ... with no gap) from the from-th on.
func (s *stmts) campaignEvents(sku string, from int) []cev {
	s.T.Helper()
	rows, err := arbiter.EventsOf(s.DB).OfSKU(sku)
	require.NoError(s.T, err)
	out := []cev{}
	for i, e := range rows {
		require.EqualValues(s.T, i+1, e.Seq, "%s: seq %d is the %d-th event", sku, e.Seq, i+1)
		if i >= from {
			c := ""
			if e.CampaignID != nil {
				c = *e.CampaignID
			}
			out = append(out, cev{e.Type, c, e.OnHand, e.Reserved, e.Available})
		}
	}
	return out
}

func (s *stmts) putAllotment(c arbiter.Campaign, allotment int64) {
	s.T.Helper()
	c.Allotment = allotment
	require.NoError(s.T, s.putCampaign(c))
}

func (s *stmts) endCampaign(id string) {
	s.T.Helper()
	require.NoError(s.T, s.in(func(a arbiter.Arbiter) error {
		_, err := a.EndCampaign(id, time.Now().UTC().Truncate(time.Microsecond))
		return err
	}))
}

// Every path that moves a campaign's pool announces what it crosses, once,
// in the SKU's seq stream with the SKU's levels: the first sale opens it
// (no events job ran), the sale of the last unit sells it out, a cancelled
// sale back in a sold-out pool brings it back, a put that grows or shrinks
// the allotment across zero crosses too, and the end closes it (before
// what its returned rest crosses for the SKU); a sale, a release or an end
// that crosses nothing writes nothing, and nothing follows the end.
func TestCampaignEventsEachPathCrossesOnce(t *testing.T) {
	s := newStmts(t)
	sku, id := testenv.Unique("CEV"), testenv.Unique("c")
	s.setSKU(sku, arbiter.Settings{OnHand: 10})
	c := campaign(id, sku, 3, 0, time.Now().Add(-time.Minute))
	require.NoError(t, s.putCampaign(c))
	n := 0
	step := func(what string, want ...cev) {
		t.Helper()
		if want == nil {
			want = []cev{}
		}
		require.Equal(t, want, s.campaignEvents(sku, n), what)
		n += len(want)
	}
	step("a carve-out that crosses nothing of the SKU's, before any sale")
	sell := func(order string) {
		t.Helper()
		_, err := s.reserve(sale(order, sku, id, 1, ""))
		require.NoError(t, err)
	}
	sell(id + "-a")
	step("the first sale opens it", cev{arbiter.EventCampaignStarted, id, 10, 3, 7})
	sell(id + "-b")
	step("a sale that leaves units crosses nothing")
	sell(id + "-c")
	step("the last unit", cev{arbiter.EventCampaignSoldOut, id, 10, 3, 7})
	s.release(id+"-b", "")
	step("a sale released into the sold-out pool", cev{arbiter.EventCampaignBackInStock, id, 10, 3, 7})
	s.release(id+"-b", "")
	step("a release that releases nothing")
	sell(id + "-d")
	step("sold out again: a new crossing", cev{arbiter.EventCampaignSoldOut, id, 10, 3, 7})
	s.putAllotment(c, 5)
	step("a put that grows the sold-out pool", cev{arbiter.EventCampaignBackInStock, id, 10, 5, 5})
	s.putAllotment(c, 4)
	step("a put that shrinks it and leaves a unit")
	s.putAllotment(c, 3)
	step("a put that shrinks it to what is held", cev{arbiter.EventCampaignSoldOut, id, 10, 3, 7})
	s.endCampaign(id)
	step("the end of a sold-out campaign", cev{arbiter.EventCampaignEnded, id, 10, 3, 7})
	s.endCampaign(id)
	s.release(id+"-a", "")
	step("ending twice, and a sale released after the end (to the SKU), announce nothing of the campaign")

	// A campaign that ends with units left: its end, then the SKU's
	// crossing that the returned rest makes.
	sku2, id2 := testenv.Unique("CEV"), testenv.Unique("c")
	s.setSKU(sku2, arbiter.Settings{OnHand: 4})
	require.NoError(t, s.putCampaign(campaign(id2, sku2, 4, 0, time.Now().Add(-time.Minute))))
	_, err := s.reserve(sale(id2+"-a", sku2, id2, 1, ""))
	require.NoError(t, err)
	s.endCampaign(id2)
	require.Equal(t, []cev{
		{arbiter.EventSoldOut, "", 4, 4, 0},
		{arbiter.EventCampaignStarted, id2, 4, 4, 0},
		{arbiter.EventCampaignEnded, id2, 4, 1, 3},
		{arbiter.EventBackInStock, "", 4, 1, 3},
	}, s.campaignEvents(sku2, 0))
}

// A sale that rolls back announces nothing and leaves the campaign's flags
// as they were: the sale that commits the same crossing announces it.
func TestCampaignEventsRolledBackSaleWritesNone(t *testing.T) {
	s := newStmts(t)
	sku, id := testenv.Unique("CEVRB"), testenv.Unique("c")
	s.setSKU(sku, arbiter.Settings{OnHand: 5})
	require.NoError(t, s.putCampaign(campaign(id, sku, 1, 0, time.Now().Add(-time.Minute))))
	boom := errors.New("boom")
	err := s.in(func(a arbiter.Arbiter) error {
		if _, err := a.Reserve([]arbiter.Hold{sale(id+"-a", sku, id, 1, "")}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Empty(t, s.campaignEvents(sku, 0), "the rolled-back sale opened and sold out nothing")
	_, err = s.reserve(sale(id+"-b", sku, id, 1, ""))
	require.NoError(t, err)
	require.Equal(t, []cev{{arbiter.EventCampaignStarted, id, 5, 1, 4}, {arbiter.EventCampaignSoldOut, id, 5, 1, 4}},
		s.campaignEvents(sku, 0))
}

// Concurrent sales racing for a pool's last units through one conditional
// UPDATE each announce one campaign.sold_out per fall to zero, and the
// racing cancels that follow one campaign.back_in_stock per rise: rounds
// of more buyers than units.
func TestCampaignEventsRaceAcrossZero(t *testing.T) {
	s := newStmts(t)
	sku, id := testenv.Unique("CEVRACE"), testenv.Unique("c")
	const units, buyers, rounds = 3, 12, 3
	s.setSKU(sku, arbiter.Settings{OnHand: 10})
	require.NoError(t, s.putCampaign(campaign(id, sku, units, 0, time.Now().Add(-time.Minute))))
	want := []string{arbiter.EventCampaignStarted}
	for round := range rounds {
		orders := make([]string, buyers)
		testrig.Race(buyers, func(i int) {
			o := fmt.Sprintf("%s-r%d-%d", id, round, i)
			if _, err := s.reserve(sale(o, sku, id, 1, "")); err == nil {
				orders[i] = o
			}
		})
		require.Equal(t, arbiter.CampaignCounts{Held: units}, s.counts(id))
		want = append(want, arbiter.EventCampaignSoldOut)
		testrig.Race(buyers, func(i int) {
			if orders[i] != "" {
				s.release(orders[i], "")
			}
		})
		want = append(want, arbiter.EventCampaignBackInStock)
		var got []string
		for _, e := range s.campaignEvents(sku, 0) {
			got = append(got, e.Type)
		}
		require.Equal(t, want, got, "round %d", round)
	}
}

// A campaign sale that crosses nothing costs not one statement more than
// before campaign events: the read of the pool after its UPDATE, which the
// sale runs anyway for its fence, takes the pool's units and the
// campaign's flags too. The crossing sales pay for their events.
func TestCampaignSaleCrossingNothingCostsNoStatement(t *testing.T) {
	s := newStmts(t)
	sku, id := testenv.Unique("CEVN"), testenv.Unique("c")
	s.setSKU(sku, arbiter.Settings{OnHand: 10})
	require.NoError(t, s.putCampaign(campaign(id, sku, 3, 0, time.Now().Add(-time.Minute))))
	cost := func(order string) int64 {
		return testrig.CountStatements(t, s.DB, func() {
			_, err := s.reserve(sale(order, sku, id, 1, ""))
			require.NoError(t, err)
		})
	}
	first, middle, last := cost(id+"-a"), cost(id+"-b"), cost(id+"-c")
	t.Logf("statements of a campaign sale: the first %d, one that crosses nothing %d, the last %d", first, middle, last)
	require.EqualValues(t, campaignSaleStatements, middle)
	require.Greater(t, first, middle, "the first sale writes campaign.started")
	require.Greater(t, last, middle, "the last writes campaign.sold_out")
}

// campaignSaleStatements is what arbiter.Reserve sends for one campaign
// sale with no buyer limit: the reservation's INSERT, the pool's
// conditional UPDATE and its fence read. It moves no SKU's row, so it
// reads no SKU's fence.
const campaignSaleStatements = 3
