package webhooks_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/webhooks"
)

// resolver answers every host with addrs.
type resolver []netip.Addr

func (r resolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) { return r, nil }

// A target is refused when its host is, or resolves to (any of its
// addresses), a loopback, private, link-local, metadata, shared or
// unspecified address; and when it is not https, unless the operator
// allows each.
func TestCheckTarget(t *testing.T) {
	ctx := context.Background()
	public := webhooks.Policy{Resolver: resolver{netip.MustParseAddr("93.184.215.14")}}
	require.NoError(t, webhooks.CheckTarget(ctx, "https://shop.example.com/hooks", public))
	for _, u := range []string{"http://shop.example.com/hooks", "ftp://shop.example.com", "/hooks", "https://user:pw@shop.example.com/",
		"https://127.0.0.1/", "https://[::1]/", "https://10.1.2.3/", "https://192.168.0.1/", "https://172.16.0.1/",
		"https://169.254.169.254/latest/meta-data", "https://[fe80::1]/", "https://[fd00:ec2::254]/", "https://100.100.100.200/",
		"https://0.0.0.0/", "https://[::ffff:127.0.0.1]/", "https://224.0.0.1/"} {
		err := webhooks.CheckTarget(ctx, u, public)
		require.ErrorIs(t, err, inventory.ErrInvalidArgument, u)
	}
	for _, a := range []string{"127.0.0.1", "10.0.0.7", "169.254.169.254", "::1"} {
		rebound := webhooks.Policy{Resolver: resolver{netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr(a)}}
		require.ErrorContains(t, webhooks.CheckTarget(ctx, "https://shop.example.com/", rebound), "loopback, private, link-local or metadata",
			"a name with one address of %s among public ones", a)
	}
	require.NoError(t, webhooks.CheckTarget(ctx, "http://shop.example.com/", webhooks.Policy{AllowHTTP: true, Resolver: public.Resolver}))
	require.NoError(t, webhooks.CheckTarget(ctx, "https://127.0.0.1:8443/", webhooks.Policy{AllowPrivate: true}))
	require.Error(t, webhooks.CheckTarget(ctx, "http://127.0.0.1/", webhooks.Policy{AllowPrivate: true}), "private allowed, http not")
}
