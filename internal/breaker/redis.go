package breaker

import (
	"context"
	"net"

	"github.com/redis/go-redis/v9"
)

// RedisHook puts every command and pipeline of a go-redis client under b
// (client.AddHook(b.RedisHook())). Subscriptions are not guarded.
func (b *Breaker) RedisHook() redis.Hook { return redisHook{b} }

type redisHook struct{ b *Breaker }

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		done, err := h.b.Allow(ctx)
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		err = next(ctx, cmd)
		done(err)
		return err
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		done, err := h.b.Allow(ctx)
		if err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		err = next(ctx, cmds)
		done(err)
		return err
	}
}
