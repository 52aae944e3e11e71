package events_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/campaign"
	"github.com/acme/inventory/internal/events"
	"github.com/acme/inventory/testkit/testenv"
	"github.com/acme/inventory/testkit/testrig"
)

// putCampaign puts a campaign of a fresh SKU of stock units on r, with the
// window [starts, ends), and returns its id and SKU.
func putCampaign(t *testing.T, r *testrig.Rig, stock, allotment int64, starts, ends time.Time) (string, string) {
	t.Helper()
	sku := r.PutSKU("CEV", stock, 0)
	id := testenv.Unique("c")
	_, err := r.Campaigns.Put(context.Background(), id, campaign.Spec{SKU: sku, Allotment: allotment, StartsAt: starts, EndsAt: ends}, nil)
	require.NoError(t, err)
	return id, sku
}

// campaignTypes are the types of sku's events of campaign id, in seq order
// (the SKU's seqs checked to run with no gap).
func campaignTypes(t *testing.T, r *testrig.Rig, sku, id string) []string {
	t.Helper()
	all, err := arbiter.EventsOf(r.DB).OfSKU(sku)
	require.NoError(t, err)
	out := []string{}
	for i, e := range all {
		require.EqualValues(t, i+1, e.Seq, "%s: the seqs run with no gap", sku)
		if e.CampaignID != nil && *e.CampaignID == id {
			out = append(out, e.Type)
		}
	}
	return out
}

// Buyers racing through the group commit (many sales of one pool in a
// batch, each batch one conditional UPDATE of the pool) for more units
// than the campaign has announce one campaign.sold_out per fall to zero,
// after the one campaign.started; the cancels that follow, racing too,
// one campaign.back_in_stock; and the next round sells it out again.
func TestGroupCommitRaceAnnouncesOneCampaignSoldOut(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	const units, buyers, rounds = 20, 64, 2
	id, sku := putCampaign(t, r, 100, units, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	want := []string{arbiter.EventCampaignStarted}
	for round := range rounds {
		ids := make([]string, buyers)
		testrig.Race(buyers, func(i int) {
			if o, err := r.Campaigns.Buy(ctx, id, fmt.Sprintf("u%d-%d", round, i), ""); err == nil {
				ids[i] = o.ID
			}
		})
		n, err := arbiter.CountCampaign(r.DB, id)
		require.NoError(t, err)
		require.Equal(t, arbiter.CampaignCounts{Held: units}, n, "round %d sold the pool", round)
		want = append(want, arbiter.EventCampaignSoldOut)
		require.Equal(t, want, campaignTypes(t, r, sku, id), "round %d", round)
		testrig.Race(buyers, func(i int) {
			if ids[i] != "" {
				_, err := r.Orders.Cancel(ctx, ids[i])
				require.NoError(t, err)
			}
		})
		want = append(want, arbiter.EventCampaignBackInStock)
		require.Equal(t, want, campaignTypes(t, r, sku, id), "round %d", round)
	}
	all, err := arbiter.EventsOf(r.DB).OfSKU(sku)
	require.NoError(t, err)
	for _, e := range all {
		require.EqualValues(t, [3]int64{100, units, 100 - units}, [3]int64{e.OnHand, e.Reserved, e.Available},
			"%s: a campaign's sales leave the SKU's levels", e.Type)
	}
}

// A node whose clock runs an hour fast leads the events job: it announces
// no campaign.started before the database's clock reaches starts_at, and
// the event it writes then carries the database's time. The job runs
// every 50 ms from the put on; each round that ends before the opening
// must find nothing due (there are such rounds however busy the machine:
// the opening is 3 s after the put began).
func TestAFastClockCannotStartACampaignEarly(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	opens := time.Now().Add(3 * time.Second).UTC().Truncate(time.Microsecond)
	id, sku := putCampaign(t, r, 10, 4, opens, opens.Add(time.Hour))
	fast := events.New(r.DB, r.Stock.Locker(), events.Config{Now: func() time.Time { return time.Now().Add(time.Hour) }})
	early := 0
	for {
		n, err := fast.AnnounceCampaigns(ctx)
		require.NoError(t, err)
		done := time.Now()
		if n > 0 {
			require.Equal(t, 1, n)
			require.False(t, done.Before(opens), "campaign.started written before the opening (%s)", opens)
			break
		}
		if done.Before(opens) {
			early++
		}
		require.True(t, done.Before(opens.Add(time.Minute)), "never started")
		time.Sleep(50 * time.Millisecond)
	}
	require.Positive(t, early, "rounds before the opening")
	n, err := fast.AnnounceCampaigns(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "once")
	all, err := arbiter.EventsOf(r.DB).OfSKU(sku)
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Equal(t, arbiter.EventCampaignStarted, all[0].Type)
	require.Equal(t, id, *all[0].CampaignID)
	require.False(t, all[0].OccurredAt.Before(opens), "stamped %s, opened %s", all[0].OccurredAt, opens)
	require.True(t, all[0].OccurredAt.Before(time.Now().Add(time.Minute)), "stamped by the database's clock, not the fast node's: %s", all[0].OccurredAt)
	require.EqualValues(t, [3]int64{10, 4, 6}, [3]int64{all[0].OnHand, all[0].Reserved, all[0].Available})
}

// A campaign ended by the route (on two nodes) as its window passes, which
// the events job (on two nodes that both believe they lead) and the
// timeout sweep (its pool's deadline) see at the same moment: exactly one
// campaign.ended, and nothing of the campaign after it. Rounds of fresh
// campaigns, the racers let go at ends_at and a little after, so each of
// them wins some rounds however busy the machine is; and the two orders
// one after the other.
func TestCampaignEndedOnceByTheRouteAndItsWindow(t *testing.T) {
	r := testrig.New(t, testrig.MemoryTransport(t))
	ctx := context.Background()
	jobs := []*events.Job{events.New(r.DB, r.Stock.Locker(), events.Config{}), events.New(r.DB, r.Stock.Locker(), events.Config{})}
	sweeper := testrig.Assemble(t, r.Transport, r.DB, r.RDB, testrig.Opts{}) // a node whose clock passed every ends_at
	sweeper.Clock.Advance(time.Hour)
	// endsSoon is a campaign that sold a unit (and so opened), whose
	// window is then moved to end 200 ms later, and has just ended.
	endsSoon := func() (string, string, time.Time) {
		starts := time.Now().Add(-time.Minute)
		id, sku := putCampaign(t, r, 10, 3, starts, starts.Add(2*time.Hour))
		_, err := r.Campaigns.Buy(ctx, id, "u", "")
		require.NoError(t, err)
		ends := time.Now().Add(200 * time.Millisecond).UTC().Truncate(time.Microsecond)
		_, err = r.Campaigns.Put(ctx, id, campaign.Spec{SKU: sku, Allotment: 3, StartsAt: starts, EndsAt: ends}, nil)
		require.NoError(t, err)
		for time.Now().Before(ends) {
			time.Sleep(time.Millisecond)
		}
		return id, sku, ends
	}
	ended := []string{arbiter.EventCampaignStarted, arbiter.EventCampaignEnded}

	id, sku, _ := endsSoon()
	n, err := jobs[0].AnnounceCampaigns(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the window passed: the job ends it")
	_, err = r.Campaigns.End(ctx, id)
	require.NoError(t, err)
	require.Equal(t, ended, campaignTypes(t, r, sku, id), "the route after the job")
	id, sku, _ = endsSoon()
	_, err = r.Campaigns.End(ctx, id)
	require.NoError(t, err)
	n, err = jobs[0].AnnounceCampaigns(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, ended, campaignTypes(t, r, sku, id), "the job after the route")

	for round := range 6 {
		id, sku, ends := endsSoon()
		time.Sleep(time.Duration(round*round) * time.Millisecond)
		testrig.Race(6, func(i int) {
			switch i {
			case 0, 1: // the end route
				_, err := r.Campaigns.End(ctx, id)
				require.NoError(t, err)
			case 2, 3: // the events job, until the database's clock passed ends_at
				for time.Now().Before(ends.Add(100 * time.Millisecond)) {
					_, err := jobs[i-2].AnnounceCampaigns(ctx)
					require.NoError(t, err)
				}
			default: // the timeout sweep: the pool's deadline passed
				_, err := sweeper.Tokens.ReleaseExpired(ctx, 100)
				require.NoError(t, err)
			}
		})
		for _, j := range jobs {
			_, err := j.AnnounceCampaigns(ctx)
			require.NoError(t, err)
		}
		require.Equal(t, ended, campaignTypes(t, r, sku, id), "round %d", round)
	}
}
