package tokens_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/httpapi"
)

const clientToken = "client-credential-of-the-checkout-backend-0001"

// deduct posts a deduction to the HTTP API on the rig's services and
// returns the status and the body.
func (s *rig) deduct(h http.Handler, sku string, qty int64, token string) (int, string) {
	s.T.Helper()
	req := httptest.NewRequest("POST", "/v1/stock/deduct",
		strings.NewReader(fmt.Sprintf(`{"sku":%q,"qty":%d,"token":%q}`, sku, qty, token)))
	req.Header.Set("Authorization", "Bearer "+clientToken)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// handler is the HTTP API on the rig's services.
func (s *rig) handler() http.Handler {
	return httpapi.New(httpapi.Config{ClientTokens: []string{clientToken}},
		httpapi.Services{Orders: s.Orders, Catalog: s.Catalog, Tokens: s.Tokens, Listing: s.Listing}, nil).Handler()
}

// A replay answers as the first call did whatever Redis remembers: after
// Redis lost every key (the tokens with them) and the SKU sold out
// meanwhile, so Redis cannot cover the quantity again, a held token's
// replay gets the first answer's body, a committed one's too, another
// quantity is a conflict, a released one is a conflict (released), and
// only a token the database never recorded is refused for lack of stock.
// No replay takes anything, in Redis or in the database.
func TestReplayAfterRedisForgotTheToken(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	h := r.handler()
	sku := "RF"
	r.AddSKU(sku, 6)
	first := map[string]string{} // token -> the first call's body
	ok := func(qty int64, token, result string) {
		t.Helper()
		code, body := r.deduct(h, sku, qty, token)
		require.Equal(t, http.StatusOK, code, body)
		if first[token] == "" {
			first[token] = body
			require.Contains(t, body, `{"result":`+result+`,"expires_at":"`)
		}
		require.Equal(t, first[token], body, "%d of %s: the first call's body", qty, token)
	}
	ok(2, "held", "4")
	ok(1, "gone", "3")
	n, err := r.Tokens.Release(ctx, sku, "gone")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	ok(1, "sold", "3")
	q, err := r.Tokens.Commit(ctx, sku, "sold")
	require.NoError(t, err)
	require.EqualValues(t, 1, q)
	ok(3, "last", "0")
	r.RequireQty(sku, 6, 6)

	require.NoError(t, r.RDB.FlushDB(ctx).Err()) // this test's Redis database loses every key
	for range 2 {
		ok(2, "held", "4")
		ok(1, "sold", "3")
		ok(3, "last", "0")
		for _, c := range []struct {
			qty   int64
			token string
			want  string
		}{
			{3, "held", `{"error":{"code":"conflict","message":"token was used for 2 units, not 3"}}`},
			{1, "gone", `{"error":{"code":"conflict","message":"reservation already released"}}`},
			{1, "new", `{"error":{"code":"insufficient_stock","message":"insufficient stock: RF"}}`},
		} {
			code, body := r.deduct(h, sku, c.qty, c.token)
			require.Equal(t, http.StatusConflict, code, body)
			require.JSONEq(t, c.want, body, "%d of %s", c.qty, c.token)
		}
	}
	r.RequireQty(sku, 6, 6)
	require.EqualValues(t, 0, r.levels(sku).Available, "nothing taken or given in Redis")
	require.Equal(t, []resRow{{sku, 2, arbiter.Held}}, r.resRows("t.held"))
	require.Equal(t, []resRow{{sku, 1, arbiter.Released}}, r.resRows("t.gone"))
	require.Equal(t, []resRow{{sku, 1, arbiter.Committed}}, r.resRows("t.sold"))
	require.Equal(t, []resRow{{sku, 3, arbiter.Held}}, r.resRows("t.last"))
	require.Empty(t, r.resRows("t.new"))
	require.EqualValues(t, 4, r.movements(sku, arbiter.MoveReserve))
	require.EqualValues(t, 1, r.movements(sku, arbiter.MoveRelease))
	r.CheckInvariant(sku)
}

// Many replays of one token at once, after Redis forgot it: with the SKU
// sold out (Redis refuses each, the database answers) and with units back
// in stock (Redis takes each again, the database refuses the duplicate and
// the units are given back), every replay gets the first answer and
// nothing is taken twice: reserved and the reservation rows are exactly
// the first call's, and Redis ends where the database is.
func TestReplaysRaceAfterRedisForgot(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	sku := "RR"
	r.AddSKU(sku, 5)
	left, err := r.Tokens.Reserve(ctx, sku, 3, "tok")
	require.NoError(t, err)
	require.EqualValues(t, 2, left)
	_, err = r.Tokens.Reserve(ctx, sku, 2, "rest")
	require.NoError(t, err)

	race := func(phase string) {
		t.Helper()
		var mu sync.Mutex
		answers := map[string]int{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got, err := r.Tokens.Reserve(ctx, sku, 3, "tok")
				mu.Lock()
				defer mu.Unlock()
				answers[fmt.Sprint(got, err)]++
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, map[string]int{"2 <nil>": 32}, answers, phase)
		require.Equal(t, []resRow{{sku, 3, arbiter.Held}}, r.resRows("t.tok"), phase)
		require.EqualValues(t, 2, r.movements(sku, arbiter.MoveReserve), phase)
	}

	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	race("sold out")
	r.RequireQty(sku, 5, 5)
	require.EqualValues(t, 0, r.levels(sku).Available)

	n, err := r.Tokens.Release(ctx, sku, "rest")
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	_, err = r.Catalog.Adjust(ctx, sku, 4, "restock", "")
	require.NoError(t, err)
	require.NoError(t, r.RDB.FlushDB(ctx).Err())
	race("in stock")
	r.RequireQty(sku, 9, 3)
	require.EqualValues(t, 6, r.levels(sku).Available, "every unit a replay took again was given back")
	r.CheckInvariant(sku)
}
