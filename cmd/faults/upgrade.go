package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/acme/inventory/internal/lock"
	"github.com/acme/inventory/testkit/servers"
)

// upgradeFrom is the release the upgrade scenario's fleet starts on: a
// commit of main that passed its CI, before the schema change the
// scenario guards (issue 43: the lean sale's expand, backfill, switch and
// contract each land against it). Move it forward when a release that
// users run is made; it must stay in main's history.
const upgradeFrom = "621600fcbcb29c888c6eef9eb38e5676cae8a228"

// upgrade is the rolling upgrade of a two-node fleet under load: the
// fleet runs the release before (migrated by it), the new release's
// migrate runs while the old nodes serve, then each node in turn is
// stopped gracefully and started on the new binary, so old and new
// binaries serve side by side for a while. The checks are every
// scenario's (all zeros, the history linearizable), and after the run
// every acknowledged order and token commit answers through the new
// fleet as it did when it was made (answersAsBefore). The old release
// cannot read the lean sale's holds, so the new nodes run with it off, as
// docs/operations.md tells an operator rolling from such a release to.
var upgrade = Scenario{Name: "upgrade", From: upgradeFrom, Stale: redisStale, Instances: 2, Quick: true,
	Fault: rollTo(upgradeFrom, classicEnv), After: answersAsBefore}

// leanFrom is the first release that reads and projects the lean sale's
// holds whatever its own switch says (issue 43's "read both" release).
const leanFrom = "7e14968c2f3ef6c4f158054a0697b999150c408b"

// upgradeLean is issue 43's switch: a fleet of the release that reads
// both ways and sells as before, rolled one node at a time to the new
// binary selling as the lean sale does (INVENTORY_LEAN_SALE=true), so
// for a while a node that writes the order in the sale's commit and one
// that writes one row of holds sell the same SKUs side by side.
//
// While the two write ways serve side by side, no node projects (the
// projector's lock is held, as a stalled leader's would be): the old
// node must find, pay, cancel and release the holds the new one recorded
// only in holds. From a release that cannot read them, it could not.
// That release reads a campaign's lean hold as a sale of its SKU, so the
// new nodes record campaigns' holds as before (INVENTORY_LEAN_CAMPAIGNS
// off), as docs/operations.md tells an operator rolling from it to.
var upgradeLean = Scenario{Name: "upgrade-lean", From: leanFrom, Stale: redisStale, Instances: 2, Quick: true, MinDuration: 16 * time.Second,
	Fault: rollTo(leanFrom, leanEnv, classicCampaignsEnv), After: answersAsBefore}

// rollTo is the rolling upgrade from release from: the new release's
// migrate while the old fleet serves, at a fifth of the run, then each
// node stopped gracefully and started on the new binary (with env added)
// at 40 % and 65 %, and the new release's migrate contract once no old
// node serves, at 85 %, while the new fleet sells.
func rollTo(from string, env ...string) func(ctx context.Context, r *Run) error {
	return func(ctx context.Context, r *Run) error {
		r.at(ctx, 0.2)
		if out, errOut, code, err := runCommand(ctx, r.lab.bin, r.env, "migrate"); err != nil || code != 0 {
			return fmt.Errorf("the new release's migrate beside the old fleet: exit %d %v: %s %s", code, err, out, errOut)
		}
		r.note("migrated by the new release while the old fleet served")
		for i, in := range r.fleet {
			r.at(ctx, 0.4+0.25*float64(i))
			if err := in.Restart(ctx, r.lab.bin, env...); err != nil {
				return err
			}
			if i == 0 && slices.Contains(env, leanEnv) { // mixed from here until the next roll: nobody projects
				stall := time.Duration(0.25*float64(r.duration)) + time.Second
				if err := r.redis.Client().Set(ctx, lock.ProjectorKey, "stalled-leader", stall).Err(); err != nil {
					return err
				}
				r.note("no node projects for %s, while old and new nodes serve", stall)
			}
		}
		r.note("rolled %d nodes from %.12s to the new release %v, one at a time (SIGTERM, then the new binary)", len(r.fleet), from, env)
		r.at(ctx, 0.85)
		if out, errOut, code, err := runCommand(ctx, r.lab.bin, r.env, "migrate", "contract"); err != nil || code != 0 {
			return fmt.Errorf("the new release's migrate contract after the roll: exit %d %v: %s %s", code, err, out, errOut)
		}
		r.note("contracted by the new release while the new fleet served")
		return nil
	}
}

// answersAsBefore reads every order the run was answered through the
// upgraded fleet, replays every order made under an Idempotency-Key with
// its key, and replays every token commit it was answered: each must
// answer as it did (the order found with its lines, paid if it was
// answered paid; the key's replay the same order, whichever release made
// it, before or after the contract; the commit of the same units).
func answersAsBefore(ctx context.Context, r *Run, v *Verdict) error {
	r.witness.mu.Lock()
	orders := slices.Collect(maps.Values(r.witness.orders))
	commits := maps.Clone(r.witness.commits)
	r.witness.mu.Unlock()
	read, replayed := 0, 0
	for i, o := range orders {
		url := r.fleet[i%len(r.fleet)].URL()
		a := r.client.doAt(ctx, url, http.MethodGet, "/v1/orders/"+o.ID, nil, r.client.clientHeader())
		if a.Status != http.StatusOK {
			v.Lost += sum(o.Items)
			v.problem("upgrade: order %s answered %d %v after the roll", o.ID, a.Status, a.Body)
			continue
		}
		got := (&Witness{orders: map[string]*orderSeen{}}).created(a, o.User)
		if !maps.Equal(got.Items, o.Items) {
			v.problem("upgrade: order %s has lines %v after the roll, %v when made", o.ID, got.Items, o.Items)
		}
		switch status := a.str("status"); {
		case len(o.Paid) > 0 && status != "PAID" && status != "SHIPPED" && status != "REFUNDED":
			v.problem("upgrade: order %s was answered paid, and is %s after the roll", o.ID, status)
		}
		read++
		if o.Key == "" {
			continue
		}
		var items []map[string]any
		for _, sku := range slices.Sorted(maps.Keys(o.Items)) {
			items = append(items, map[string]any{"sku": sku, "qty": o.Items[sku]})
		}
		h := r.client.buyerHeader(o.User)
		h.Set("Idempotency-Key", o.Key)
		a = r.client.doAt(ctx, url, http.MethodPost, "/v1/orders", map[string]any{"user_id": o.User, "items": items}, h)
		if a.Status != http.StatusCreated || a.str("id") != o.ID {
			v.problem("upgrade: order %s made under Idempotency-Key %s; the key's replay after the roll answers %d %v", o.ID, o.Key, a.Status, a.Body)
		}
		replayed++
	}
	for i, token := range slices.Sorted(maps.Keys(commits)) {
		url := r.fleet[i%len(r.fleet)].URL()
		a := r.client.doAt(ctx, url, http.MethodPost, "/v1/stock/commit", map[string]any{"sku": tokenSKU, "token": token}, r.client.clientHeader())
		if a.Status != http.StatusOK || a.num("committed") != commits[token] {
			v.problem("upgrade: token %s committed %d; its commit replayed after the roll answers %d %v", token, commits[token], a.Status, a.Body)
		}
	}
	r.note("after the roll: %d orders read, %d keys and %d token commits replayed, through the new fleet", read, replayed, len(commits))
	return nil
}

// release builds rev's inventoryd once per lab (git archive of the
// module's repository at rev, then go build), for a fleet that starts on
// an older release.
func (lab *Lab) release(ctx context.Context, rev string) (string, error) {
	rel := lab.rel
	rel.mu.Lock()
	defer rel.mu.Unlock()
	if bin, ok := rel.bins[rev]; ok {
		return bin, nil
	}
	root, err := servers.ModuleRoot()
	if err != nil {
		return "", err
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("release %s is not in this repository's history (the upgrade scenario builds it from git; a shallow clone lacks it): %v %s", rev, err, out)
	}
	src := filepath.Join(lab.dir, "release-"+rev[:12])
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("git archive %s: %v: %s", rev, err, out)
	}
	bin := filepath.Join(lab.dir, "inventoryd-"+rev[:12])
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/inventoryd")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build of release %s: %v: %s", rev, err, out)
	}
	rel.bins[rev] = bin
	return bin, nil
}

// releases are the older releases a lab built (Lab.release).
type releases struct {
	mu   sync.Mutex
	bins map[string]string // revision -> binary
}
