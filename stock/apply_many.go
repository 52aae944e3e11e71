package stock

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/acme/inventory"
)

// applyPipeline bounds the changes ApplyMany sends in one pipeline.
const applyPipeline = 512

// ApplyMany is Apply for many committed changes (a stock count's batch,
// one per SKU) in pipelines of up to 512 calls: each is still its own
// applyScript call, fenced and exactly once as Apply's, but thousands of
// SKUs cost Redis and the service a round trip per pipeline, not per SKU.
// A call Redis answered NOSCRIPT is sent again alone (which loads the
// script). Every change is tried; the errors are joined.
func (s *Store) ApplyMany(ctx context.Context, chs []inventory.Change) error {
	var errs []error
	for len(chs) > 0 {
		part := chs[:min(len(chs), applyPipeline)]
		chs = chs[len(part):]
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(part))
		for i, c := range part {
			if err := errors.Join(inventory.ValidateSKU(c.SKU), validateRef(c.Ref)); err != nil {
				errs = append(errs, err)
				continue
			}
			keys, args := applyCall(c)
			cmds[i] = applyScript.EvalSha(ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx) // each command's own error is read below
		for i, c := range part {
			cmd := cmds[i]
			if cmd == nil {
				continue
			}
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				keys, args := applyCall(c)
				cmd = applyScript.Run(ctx, s.rdb, keys, args...)
			}
			n, err := cmd.Int64()
			if err == nil {
				err = s.applied(ctx, c, n)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("stock: apply %s: %w", c.SKU, err))
			}
		}
	}
	return errors.Join(errs...)
}
