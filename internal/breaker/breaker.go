// Package breaker keeps a dependency that stopped answering from taking the
// service down with it: one circuit breaker per dependency (Redis, the
// database), fed by every call the service makes to it. Once a dependency
// is known down (several calls in a row failed to reach it), calls that need
// it fail at once with ErrOpen instead of waiting out their deadline; after
// a pause the breaker probes the dependency itself (a ping with a deadline
// of its own, so no caller is kept waiting on a dependency still dark), and
// the probe's success closes it again. A call the dependency answered, even with an error (a
// duplicate key, a deadlock, a script's refusal), counts as a success: only
// failures to reach it count.
package breaker

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// ErrOpen is what a call gets while its dependency's breaker is open (or
// while the one probe of a half-open breaker is under way).
var ErrOpen = errors.New("dependency unavailable (circuit open)")

// OpenError names the dependency a call was refused for; errors.Is(err,
// ErrOpen) holds.
type OpenError struct{ Dependency string }

func (e *OpenError) Error() string {
	return e.Dependency + " is unavailable (circuit open: it stopped answering); retry later"
}

func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// Defaults of Settings.
const (
	DefaultTrip = 3
	DefaultOpen = time.Second
)

// Settings tune a Breaker.
type Settings struct {
	// Trip is how many calls in a row must fail to reach the dependency
	// before the breaker opens. Default DefaultTrip.
	Trip uint32
	// Open is how long the breaker stays open before it lets a probe
	// through. Default DefaultOpen: with the request deadline, the first
	// success after a dependency comes back is at most Open + one deadline
	// away.
	Open time.Duration
	// Probe pings the dependency once the pause is over (and for Check);
	// the pause's probe has a context that ends after ProbeTimeout. Calls made with that context pass the breaker.
	// Without one, the first caller after the pause is the probe.
	Probe func(ctx context.Context) error
	// ProbeTimeout bounds a probe. Default DefaultOpen.
	ProbeTimeout time.Duration
	// OnChange is told every change of state ("closed", "open",
	// "half-open"), with what the breaker guards ("redis", or "redis shard
	// ADDR" for a shard's breaker).
	OnChange func(dependency, from, to string)
}

// Breaker is one dependency's circuit breaker, or one shard's of a sharded
// dependency (see RedisCluster).
type Breaker struct {
	name         string
	shard        string // "" for a whole dependency
	cb           *gobreaker.TwoStepCircuitBreaker[struct{}]
	probe        func(ctx context.Context) error
	probeTimeout time.Duration
	probing      atomic.Bool
}

// probeKey marks the context of a probe's calls.
type probeKey struct{}

// New returns the breaker of the dependency called name.
func New(name string, s Settings) *Breaker { return newBreaker(name, "", s) }

// newBreaker returns the breaker of shard (an address) of the dependency
// called name, or of the whole dependency when shard is "".
func newBreaker(name, shard string, s Settings) *Breaker {
	if s.Trip == 0 {
		s.Trip = DefaultTrip
	}
	if s.Open == 0 {
		s.Open = DefaultOpen
	}
	if s.ProbeTimeout == 0 {
		s.ProbeTimeout = DefaultOpen
	}
	trip := s.Trip
	b := &Breaker{name: name, shard: shard, probe: s.Probe, probeTimeout: s.ProbeTimeout}
	label := b.label()
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        label,
		MaxRequests: 1,
		Timeout:     s.Open,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= trip },
		IsSuccessful: func(err error) bool {
			return err == nil || !Unreachable(err)
		},
		// A caller that went away says nothing about the dependency.
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if s.OnChange != nil {
				s.OnChange(label, from.String(), to.String())
			}
		},
	})
	return b
}

// Name is the dependency's name.
func (b *Breaker) Name() string { return b.name }

// Shard is the address of the shard the breaker guards, "" when it guards
// the whole dependency.
func (b *Breaker) Shard() string { return b.shard }

// label names what the breaker guards in errors and logs: "redis", or
// "redis shard 127.0.0.1:7102".
func (b *Breaker) label() string {
	if b.shard == "" {
		return b.name
	}
	return b.name + " shard " + b.shard
}

// State is "closed", "open" or "half-open".
func (b *Breaker) State() string { return b.cb.State().String() }

// Err is nil while the breaker is closed, and the OpenError otherwise.
func (b *Breaker) Err() error {
	if b.cb.State() == gobreaker.StateClosed {
		return nil
	}
	return &OpenError{Dependency: b.label()}
}

// Check reports whether the dependency answers (readiness): the OpenError
// while the breaker is open, else what a ping (Settings.Probe) says now.
func (b *Breaker) Check(ctx context.Context) error {
	if err := b.Err(); err != nil || b.probe == nil {
		return err
	}
	return b.probe(ctx)
}

// Allow asks to make a call: it returns the function to report the call's
// outcome with, or an OpenError. A caller whose context has already ended
// is answered with that, without counting.
func (b *Breaker) Allow(ctx context.Context) (done func(error), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ctx.Value(probeKey{}) != nil {
		return func(error) {}, nil
	}
	if b.probe != nil && b.cb.State() == gobreaker.StateHalfOpen {
		b.startProbe()
		return nil, &OpenError{Dependency: b.label()}
	}
	done, err = b.cb.Allow()
	if err != nil {
		return nil, &OpenError{Dependency: b.label()}
	}
	return done, nil
}

// startProbe pings the dependency in the background, unless a probe is
// under way; the outcome closes the breaker or opens it for another pause.
func (b *Breaker) startProbe() {
	if !b.probing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer b.probing.Store(false)
		done, err := b.cb.Allow() // the half-open breaker's one call
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), probeKey{}, true), b.probeTimeout)
		defer cancel()
		done(b.probe(ctx))
	}()
}

// Do runs call under the breaker.
func (b *Breaker) Do(ctx context.Context, call func() error) error {
	done, err := b.Allow(ctx)
	if err != nil {
		return err
	}
	err = call()
	done(err)
	return err
}

// Unreachable reports whether err is a failure to reach Redis or the
// database (as opposed to an answer, or a bug): the request is answered 503
// and a retry may succeed.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	if errors.Is(err, ErrOpen) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, sql.ErrConnDone) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) {
		return true // the connection died or stalled under the call: a restart, a crash, a partition
	}
	msg := err.Error()
	for _, s := range transientServerErrors {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// transientServerErrors are answers of a server that is restarting or
// failing over: Redis loading its dataset, a replica or a cluster without a
// master for a slot, MariaDB shutting down.
var transientServerErrors = []string{
	"database is closed", "invalid connection", "LOADING ", "OOM ", "READONLY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ",
	"Error 1053", // ER_SERVER_SHUTDOWN
	"Error 1927", // ER_CONNECTION_KILLED
	"Error 2006", "Error 2013",
}
