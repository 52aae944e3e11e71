package maintenance

import (
	"context"
	"time"
)

// SetSettleWait makes c's realign run wait instead of sleeping for the
// settle: a test does there what happens while it watches (a sale that
// lands, or nothing).
func SetSettleWait(c *Reconciler, wait func(ctx context.Context)) {
	c.wait = func(ctx context.Context, _ time.Duration) { wait(ctx) }
}
