package main

import (
	"context"
	"database/sql"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The database's word on when the history's changes committed, used to
// find a linearization fast, never to judge one.
//
// Every change of a SKU's stock writes a movement numbered in commit order
// (its position), stamped by the node inside the transaction. So a hold
// whose RESERVE is numbered p committed after every change numbered below
// p was stamped, and before every change numbered above p was answered. The
// search is costly when many long requests overlap (each read then tries
// subset after subset of the holds in flight beside it); cut down to those
// bounds, the windows barely overlap and the search is quick. A
// linearization found in the cut windows is one of the real history, since
// each cut window lies inside the real one; when none is found (the
// numbering misled, or the history is not linearizable), the real windows
// are searched, and only that search says no.

// commit is one movement of a change the history made.
type commit struct {
	SKU      string
	Position int64
	Kind     string // RESERVE, RELEASE, RESTOCK, CORRECTION
	Ref      string // an order id, "token:" + a token, an adjust's reference
	At       time.Duration
}

// loadCommits reads the movements of the changes the history's operations
// make, stamped on the history's clock.
func loadCommits(ctx context.Context, db *sql.DB, base time.Time) ([]commit, error) {
	rows, err := db.QueryContext(ctx, `SELECT sku, position, kind, reference, created_at FROM stock_movements
		WHERE kind IN ('RESERVE', 'RELEASE', 'RESTOCK', 'CORRECTION') AND reference <> '' ORDER BY sku, position`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []commit
	for rows.Next() {
		var c commit
		var at time.Time
		if err := rows.Scan(&c.SKU, &c.Position, &c.Kind, &c.Ref, &at); err != nil {
			return nil, err
		}
		c.At = at.Sub(base)
		out = append(out, c)
	}
	return out, rows.Err()
}

// holdRef is the reference a hold's movements carry.
func holdRef(op *histOp) string {
	switch {
	case op.Token != "":
		return "token:" + op.Token
	case op.Campaign != "":
		return "" // taken from the campaign's pool: no movement of its own
	}
	return op.Order
}

// movementOf is the kind of movement the operation's change writes, if it
// writes one the history can name: a hold's reservation, its give-back (a
// cancel, the timeout, a token's release), an adjust with a reference.
func movementOf(in *skuInput) string {
	if in.ref == "" || in.out == outRefused {
		return ""
	}
	switch in.kind {
	case opCreate:
		return "RESERVE"
	case opCancel, opExpire:
		return "RELEASE"
	case opRelease:
		if in.out == outOK && in.op.N == 0 {
			return "" // a tombstone: nothing was held
		}
		return "RELEASE"
	case opAdjust:
		if in.qty > 0 {
			return "RESTOCK"
		}
		return "CORRECTION"
	}
	return ""
}

// commitWindows is h with the windows of the operations whose movements
// the database numbered cut to what the numbering implies: no earlier than
// the stamp of any movement numbered at or before theirs (less
// expirySlack, the stamp being the node's wall clock), no later than the
// answer of any operation numbered at or after theirs. A window the cut
// would empty is left as it was.
func commitWindows(h []porcupine.Operation, commits []commit) []porcupine.Operation {
	type key struct{ kind, ref string }
	first := map[key]commit{} // a reference's first movement of a kind
	for _, c := range commits {
		k := key{c.Kind, c.Ref}
		if _, ok := first[k]; !ok {
			first[k] = c
		}
	}
	out := append([]porcupine.Operation(nil), h...)
	type numbered struct {
		i   int
		pos int64
		at  time.Duration
	}
	var ns []numbered
	// One operation per movement: the one answered done first, then one
	// whose answer was lost, the timeout last (a cancel and the timeout
	// both name an order's RELEASE; an order cancelled is not expired).
	taken := map[key]bool{}
	passOf := func(in *skuInput) int {
		switch {
		case in.out == outOK:
			return 0
		case in.kind != opExpire:
			return 1
		}
		return 2
	}
	for pass := 0; pass < 3; pass++ {
		for i, o := range out {
			in := o.Input.(*skuInput)
			kind := movementOf(in)
			if kind == "" || passOf(in) != pass {
				continue
			}
			k := key{kind, in.ref}
			c, ok := first[k]
			if !ok || taken[k] || max(o.Call, int64(c.At-expirySlack)) >= o.Return {
				continue // a stamp after the answer: the numbering says nothing here
			}
			taken[k] = true
			ns = append(ns, numbered{i, c.Position, c.At})
		}
	}
	sort.Slice(ns, func(a, b int) bool { return ns[a].pos < ns[b].pos })
	lo := make([]int64, len(ns))
	hi := make([]int64, len(ns))
	floor := int64(0)
	for j, n := range ns {
		floor = max(floor, out[n.i].Call, int64(n.at-expirySlack))
		lo[j] = floor
	}
	ceil := int64(maxTime)
	for j := len(ns) - 1; j >= 0; j-- {
		ceil = min(ceil, out[ns[j].i].Return)
		hi[j] = ceil
	}
	for j, n := range ns {
		if lo[j] < hi[j] {
			out[n.i].Call, out[n.i].Return = lo[j], hi[j]
		}
	}
	return out
}
