// Package webhooks keeps the webhook subscriptions an operator makes
// (PUT, GET, DELETE /v1/webhooks/{id}): where stock events are to be
// delivered, which events and SKUs, and the secret each delivery is
// signed with. It checks a target before it is kept (https, unless the
// operator allows plain http; no loopback, private, link-local or
// metadata address, unless the operator allows private targets), and
// CheckTarget is the same check for a delivery to make again, since DNS
// can change. The secret is written, never answered and never logged.
//
// The table also keeps each subscription's delivery state, which the
// delivery job (internal/webhooks/delivery) reads and writes here: the
// feed id up to which its events were delivered (its cursor), the failed
// attempts at the oldest undelivered one, when the next may start, and
// whether it is failing. Nothing here sends anything.
package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/arbiter"
)

// Policy is what the operator allows of targets.
type Policy struct {
	// AllowHTTP lets a subscription deliver over plain http (tests, a
	// receiver on the same host). Default: https only.
	AllowHTTP bool
	// AllowPrivate lets a target resolve to loopback, private, link-local
	// or shared addresses. Default: refused, at subscription and delivery.
	AllowPrivate bool
	// Resolver looks hosts up. Default net.DefaultResolver.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
}

// MinSecretLen is the shortest secret a subscription may have: as every
// secret of the service, at least 32 characters.
const MinSecretLen = 32

// MaxSKUs bounds the SKUs one subscription names.
const MaxSKUs = 1000

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Spec is a subscription as an operator puts it.
type Spec struct {
	URL    string   `json:"url"`
	Secret string   `json:"-"`
	Events []string `json:"events"`
	SKUs   []string `json:"skus"`
}

// State is a subscription's delivery state.
type State string

const (
	Active  State = "active"  // deliveries succeed, or have not failed for long
	Failing State = "failing" // deliveries keep failing; the backlog is kept
)

// View is a subscription as an operator reads it: never its secret.
type View struct {
	ID            string     `json:"id"`
	URL           string     `json:"url"`
	Events        []string   `json:"events"`
	SKUs          []string   `json:"skus"`
	State         State      `json:"state"`
	LastSuccessAt *time.Time `json:"last_success_at,omitempty"`
	LastError     *string    `json:"last_error,omitempty"`
	LastErrorAt   *time.Time `json:"last_error_at,omitempty"`
	// DeliveredID is the feed id up to which the subscription's events
	// were delivered (its cursor): the next delivery is its first event
	// above it.
	DeliveredID int64 `json:"delivered_id"`
	// Attempts counts the failed attempts, in a row, at the oldest
	// undelivered event; FailingSince is when the first of them failed,
	// NextAttemptAt when the next may start (absent: now).
	Attempts      int        `json:"attempts"`
	FailingSince  *time.Time `json:"failing_since,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// Backlog counts the events of the subscription not delivered yet.
	Backlog   int64     `json:"backlog"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// row is the table's row.
type row struct {
	ID            string `gorm:"primaryKey"`
	URL           string `gorm:"column:url"`
	Secret        string
	Events        string
	SKUs          string `gorm:"column:skus"`
	State         State
	DeliveredID   int64 `gorm:"column:delivered_id"`
	LastSuccessAt *time.Time
	LastError     *string
	LastErrorAt   *time.Time
	Attempts      int
	FailingSince  *time.Time
	NextAttemptAt *time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

func (row) TableName() string { return "webhooks" }

// Service keeps the subscriptions.
type Service struct {
	db     *gorm.DB
	policy Policy
	log    *slog.Logger
	now    func() time.Time
}

// New is the subscriptions on db under policy.
func New(db *gorm.DB, policy Policy, log *slog.Logger) *Service {
	if policy.Resolver == nil {
		policy.Resolver = net.DefaultResolver
	}
	if log == nil {
		log = slog.Default()
	}
	return &Service{db: db, policy: policy, log: log, now: time.Now}
}

// Put creates subscription id or replaces it with s. A new subscription
// starts at the feed's head: it is delivered the events that follow. A
// replaced one keeps its place and its delivery state.
func (svc *Service) Put(ctx context.Context, id string, s Spec) (*View, error) {
	if err := svc.validate(ctx, id, &s); err != nil {
		return nil, err
	}
	events, _ := json.Marshal(s.Events)
	skus, _ := json.Marshal(s.SKUs)
	now := svc.now().UTC().Truncate(time.Microsecond)
	err := arbiter.Transact(ctx, svc.db, func(tx *gorm.DB) error {
		res := tx.Model(&row{}).Where("id = ?", id).Updates(map[string]any{
			"url": s.URL, "secret": s.Secret, "events": string(events), "skus": string(skus), "updated_at": now,
		})
		if res.Error != nil || res.RowsAffected == 1 {
			return res.Error
		}
		head, err := arbiter.EventsOf(tx).Head()
		if err != nil {
			return err
		}
		return tx.Create(&row{ID: id, URL: s.URL, Secret: s.Secret, Events: string(events), SKUs: string(skus),
			State: Active, DeliveredID: head, CreatedAt: now, UpdatedAt: now}).Error
	})
	if err != nil {
		return nil, err
	}
	svc.log.Info("webhook put", "id", id, "url", s.URL, "events", s.Events, "skus", len(s.SKUs))
	return svc.Get(ctx, id)
}

// Get reads subscription id with its backlog.
func (svc *Service) Get(ctx context.Context, id string) (*View, error) {
	var rows []row
	if err := svc.db.WithContext(ctx).Where("id = ?", id).Find(&rows).Error; err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: no webhook %s", inventory.ErrNotFound, id)
	}
	return svc.view(ctx, rows[0])
}

// List reads every subscription, in id order.
func (svc *Service) List(ctx context.Context) ([]View, error) {
	var rows []row
	if err := svc.db.WithContext(ctx).Order("id").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]View, 0, len(rows))
	for _, r := range rows {
		v, err := svc.view(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, *v)
	}
	return out, nil
}

// Delete removes subscription id (inventory.ErrNotFound if none) and
// returns it as it was.
func (svc *Service) Delete(ctx context.Context, id string) (*View, error) {
	v, err := svc.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	res := svc.db.WithContext(ctx).Where("id = ?", id).Delete(&row{})
	if res.Error != nil {
		return nil, res.Error
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("%w: no webhook %s", inventory.ErrNotFound, id)
	}
	svc.log.Info("webhook deleted", "id", id)
	return v, nil
}

func (svc *Service) view(ctx context.Context, r row) (*View, error) {
	v := &View{ID: r.ID, URL: r.URL, State: r.State, LastSuccessAt: r.LastSuccessAt, LastError: r.LastError,
		LastErrorAt: r.LastErrorAt, DeliveredID: r.DeliveredID, Attempts: r.Attempts, FailingSince: r.FailingSince,
		NextAttemptAt: r.NextAttemptAt, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
	if err := r.filters(&v.Events, &v.SKUs); err != nil {
		return nil, err
	}
	backlog, err := arbiter.EventsOf(svc.db.WithContext(ctx)).
		Count(arbiter.EventFilter{After: r.DeliveredID, Types: v.Events, SKUs: v.SKUs})
	if err != nil {
		return nil, err
	}
	v.Backlog = backlog
	return v, nil
}

// filters decodes the stored events and skus.
func (r row) filters(events, skus *[]string) error {
	if err := errors.Join(json.Unmarshal([]byte(r.Events), events), json.Unmarshal([]byte(r.SKUs), skus)); err != nil {
		return fmt.Errorf("webhook %s: stored events or skus: %w", r.ID, err)
	}
	return nil
}

// Policy is what the operator allows of targets (the delivery checks each
// attempt against the same).
func (svc *Service) Policy() Policy { return svc.policy }

// Resume makes subscription id's next attempt start now and marks it
// active (POST /v1/webhooks/{id}/resume): its failed attempts are
// forgotten, its backlog is kept, and it is delivered from where it
// stopped.
func (svc *Service) Resume(ctx context.Context, id string) (*View, error) {
	res := svc.db.WithContext(ctx).Model(&row{}).Where("id = ?", id).Updates(map[string]any{
		"state": Active, "attempts": 0, "failing_since": nil, "next_attempt_at": nil,
	})
	if res.Error != nil {
		return nil, res.Error
	}
	if res.RowsAffected == 1 { // 0: none, or nothing to reset (MySQL counts changed rows)
		svc.log.Info("webhook resumed", "id", id)
	}
	return svc.Get(ctx, id)
}

// validate checks a put: the id, the target (CheckTarget), the secret's
// length, the events' names, the SKUs' names. Events and SKUs are kept
// sorted and without repeats.
func (svc *Service) validate(ctx context.Context, id string, s *Spec) error {
	if !idPattern.MatchString(id) {
		return inventory.Invalidf("a webhook id must be 1-64 characters of A-Z a-z 0-9 . _ -, got %q", inventory.Truncate(id))
	}
	if len(s.Secret) < MinSecretLen || len(s.Secret) > 255 {
		return inventory.Invalidf("secret must be %d to 255 characters (e.g. openssl rand -hex 32)", MinSecretLen)
	}
	if len(s.Events) == 0 {
		return inventory.Invalidf("events must name at least one of %v", arbiter.EventTypes)
	}
	for _, e := range s.Events {
		if !slices.Contains(arbiter.EventTypes, e) {
			return inventory.Invalidf("unknown event %q: events are %v", inventory.Truncate(e), arbiter.EventTypes)
		}
	}
	if len(s.SKUs) > MaxSKUs {
		return inventory.Invalidf("skus may name at most %d SKUs (none: every SKU)", MaxSKUs)
	}
	for _, sku := range s.SKUs {
		if err := inventory.ValidateSKU(sku); err != nil {
			return err
		}
	}
	slices.Sort(s.Events)
	s.Events = slices.Compact(s.Events)
	if s.SKUs == nil {
		s.SKUs = []string{}
	}
	slices.Sort(s.SKUs)
	s.SKUs = slices.Compact(s.SKUs)
	return CheckTarget(ctx, s.URL, svc.policy)
}

// CheckTarget refuses a webhook target the policy does not allow: not an
// absolute http(s) URL, plain http unless allowed, credentials in the URL,
// or a host that is, or resolves to, a loopback, private, link-local
// (cloud metadata among them), shared, multicast or unspecified address,
// unless private targets are allowed. Delivery checks again before each
// attempt (DNS can change), and its dialer checks the address it connects
// to.
func CheckTarget(ctx context.Context, raw string, p Policy) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || len(raw) > 2048 {
		return inventory.Invalidf("url must be an absolute https URL of at most 2048 characters")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowHTTP:
	case u.Scheme == "http":
		return inventory.Invalidf("url must be https (plain http only when the operator sets INVENTORY_WEBHOOK_ALLOW_HTTP)")
	default:
		return inventory.Invalidf("url must be https, not %q", inventory.Truncate(u.Scheme))
	}
	if u.User != nil {
		return inventory.Invalidf("url must not carry credentials; the secret signs each delivery")
	}
	if u.Fragment != "" {
		return inventory.Invalidf("url must not have a fragment")
	}
	if p.AllowPrivate {
		return nil
	}
	host := u.Hostname()
	addrs := []netip.Addr{}
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = append(addrs, a)
	} else {
		r := p.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if addrs, err = r.LookupNetIP(lctx, "ip", host); err != nil || len(addrs) == 0 {
			return inventory.Invalidf("url's host %q does not resolve", inventory.Truncate(host))
		}
	}
	for _, a := range addrs {
		if !Public(a) {
			return inventory.Invalidf("url's host %q is a loopback, private, link-local or metadata address (%s); "+
				"refused unless the operator sets INVENTORY_WEBHOOK_ALLOW_PRIVATE", inventory.Truncate(host), a)
		}
	}
	return nil
}

// shared is the carrier-grade NAT range (RFC 6598), where some clouds put
// their metadata service (100.100.100.200).
var shared = netip.MustParsePrefix("100.64.0.0/10")

// Public reports whether a is an address a webhook may be delivered to:
// not loopback, private (RFC 1918, unique local), link-local (169.254/16,
// the metadata services among them; fe80::/10), shared (RFC 6598),
// multicast or unspecified. An IPv4-mapped IPv6 address is judged as its
// IPv4 address.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && !a.IsLoopback() && !a.IsPrivate() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() &&
		!a.IsInterfaceLocalMulticast() && !a.IsMulticast() && !a.IsUnspecified() && !shared.Contains(a)
}
