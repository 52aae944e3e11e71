package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A catalog import runs in parallel: creates of new SKUs (two callers
// racing to create the same one among them), puts of existing ones and
// adjusts of one SKU, all at once through the real binary on the real
// MariaDB. Each put takes the row's lock before it writes, and a lock on a
// row that does not exist yet is a gap lock, which two creates both hold
// and then both need for their inserts: MariaDB picks one as a deadlock
// victim (1213). Before issue 29 the victim was answered 500; now every
// catalog write runs again when the database chose it as a victim, and
// every request is answered as if it had run alone.
func TestConcurrentCatalogImport(t *testing.T) {
	env, db := realEnv(t)
	p := start(t, env...)
	admin := "Bearer " + adminToken
	for _, sku := range []string{"OLD-0", "OLD-1", "OLD-2", "ADJ"} {
		st, body := p.call("PUT", "/v1/skus/"+sku, `{"stock":100}`, "Authorization", admin)
		require.Equal(t, 200, st, body)
	}

	type req struct{ method, path, body string }
	var reqs []req
	const news, same, adjusts = 40, 8, 24
	for i := range news {
		reqs = append(reqs, req{"PUT", fmt.Sprintf("/v1/skus/NEW-%02d", i), fmt.Sprintf(`{"stock":%d,"per_user_limit":%d}`, i+1, i%3)})
	}
	for i := range same { // each created by two callers at once, with one body
		for range 2 {
			reqs = append(reqs, req{"PUT", fmt.Sprintf("/v1/skus/SAME-%d", i), fmt.Sprintf(`{"stock":%d}`, 50+i)})
		}
	}
	for i := range 3 { // existing SKUs, each put twice with one body
		for range 2 {
			reqs = append(reqs, req{"PUT", fmt.Sprintf("/v1/skus/OLD-%d", i), fmt.Sprintf(`{"stock":%d,"per_user_limit":1}`, 200+i)})
		}
	}
	for i := range adjusts {
		reqs = append(reqs, req{"POST", "/v1/skus/ADJ/adjust", fmt.Sprintf(`{"delta":%d,"reason":"restock","reference":"po-%d"}`, i+1, i)})
	}

	var mu sync.Mutex
	codes := map[int]int{}
	var failures []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			hr, err := http.NewRequest(r.method, p.base+r.path, bytes.NewBufferString(r.body))
			if err == nil {
				hr.Header.Set("Authorization", admin)
			}
			var resp *http.Response
			if err == nil {
				resp, err = http.DefaultClient.Do(hr)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s %s: %v", r.method, r.path, err))
				return
			}
			raw, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			codes[resp.StatusCode]++
			if resp.StatusCode != 200 {
				failures = append(failures, fmt.Sprintf("%s %s -> %d %s", r.method, r.path, resp.StatusCode, raw))
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, failures)
	require.Equal(t, map[int]int{200: len(reqs)}, codes)

	// The exact rows: every SKU once, with what its one put or its adjusts say.
	want := map[string][3]int64{"ADJ": {100 + adjusts*(adjusts+1)/2, 0, 0}}
	for i := range news {
		want[fmt.Sprintf("NEW-%02d", i)] = [3]int64{int64(i + 1), 0, int64(i % 3)}
	}
	for i := range same {
		want[fmt.Sprintf("SAME-%d", i)] = [3]int64{int64(50 + i), 0, 0}
	}
	for i := range 3 {
		want[fmt.Sprintf("OLD-%d", i)] = [3]int64{int64(200 + i), 0, 1}
	}
	rows, err := db.Query(`SELECT sku, on_hand, reserved, per_user_limit FROM skus`)
	require.NoError(t, err)
	got := map[string][3]int64{}
	for rows.Next() {
		var sku string
		var v [3]int64
		require.NoError(t, rows.Scan(&sku, &v[0], &v[1], &v[2]))
		got[sku] = v
	}
	require.NoError(t, rows.Err())
	require.Equal(t, want, got)

	// The history: one opening movement per new SKU (the losing creator of
	// a SAME-* put it again at the same stock: no movement), one per change
	// of an existing one, one per adjust.
	moves := map[string]int{}
	rows, err = db.Query(`SELECT sku, COUNT(*) FROM stock_movements GROUP BY sku`)
	require.NoError(t, err)
	for rows.Next() {
		var sku string
		var n int
		require.NoError(t, rows.Scan(&sku, &n))
		moves[sku] = n
	}
	require.NoError(t, rows.Err())
	wantMoves := map[string]int{"ADJ": 1 + adjusts}
	for sku := range want {
		if _, ok := wantMoves[sku]; !ok {
			wantMoves[sku] = 1
		}
	}
	for i := range 3 {
		wantMoves[fmt.Sprintf("OLD-%d", i)] = 2 // opened at 100, set to 200+i once (the second put changes nothing)
	}
	require.Equal(t, wantMoves, moves)

	// Redis followed every change.
	for sku, v := range want {
		p.requireSKU(skuView(sku, v[0], 0, v[0], v[2]))
	}
}
