package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/client"
	"github.com/acme/inventory/internal/arbiter"
	"github.com/acme/inventory/internal/httpapi"
	"github.com/acme/inventory/internal/identity"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary compiles inventoryd once for the package's tests (without -race:
// the RocketMQ client it links is racy itself, see mq/rocketmq_test.go).
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inventoryd-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "inventoryd")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = err
			binPath = string(out)
		}
	})
	require.NoError(t, buildErr, binPath)
	return binPath
}

// proc is a running inventoryd.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	base string
	// client and buyerKey are the client credential and buyer-token key the
	// process was configured with (read from its banner in embedded mode):
	// api and call use them as the checkout backend would.
	client, buyerKey string
	mu               sync.Mutex // guards stdout and stderr
	stdout           bytes.Buffer
	stderr           bytes.Buffer
	exited           chan error

	// api is the generated client as the checkout backend holds it: every
	// call carries the client credential (a call's own BearerAuth, such as
	// the admin token, replaces it).
	api *client.ClientWithResponses
}

// output is everything the process wrote so far (stdout, stderr).
func (p *proc) output() (string, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String(), p.stderr.String()
}

// start runs inventoryd serve with env (plus the test's environment minus
// INVENTORY_* variables) on 127.0.0.1:0 and waits until it listens.
func start(t *testing.T, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary(t))
	for _, kv := range os.Environ() {
		if len(kv) < 10 || kv[:10] != "INVENTORY_" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "INVENTORY_HTTP_ADDR=127.0.0.1:0")
	cmd.Env = append(cmd.Env, env...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	p := &proc{t: t, cmd: cmd, exited: make(chan error, 1)}
	cmd.Stdout = &lockedWriter{mu: &p.mu, w: &p.stdout}
	stderrCopy := &lockedWriter{mu: &p.mu, w: &p.stderr}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	addr := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		found := false
		for lines.Scan() {
			_, _ = stderrCopy.Write(append(lines.Bytes(), '\n'))
			var entry struct{ Msg, Addr string }
			if !found && json.Unmarshal(lines.Bytes(), &entry) == nil && entry.Msg == "listening" {
				addr <- entry.Addr
				found = true
			}
		}
		if !found {
			close(addr)
		}
		p.exited <- cmd.Wait()
	}()
	select {
	case a, ok := <-addr:
		require.True(t, ok, "inventoryd exited before listening")
		p.base = "http://" + a
	case <-time.After(60 * time.Second):
		t.Fatal("inventoryd did not start listening")
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "INVENTORY_CLIENT_TOKENS="); ok {
			p.client, _, _ = strings.Cut(v, ",")
		}
		if v, ok := strings.CutPrefix(kv, "INVENTORY_BUYER_KEY="); ok {
			p.buyerKey = v
		}
	}
	p.api = p.newAPI()
	return p
}

// newAPI is the generated client for this process with the client
// credential it was configured with (none yet in embedded mode before
// exports reads the banner's).
func (p *proc) newAPI() *client.ClientWithResponses {
	p.t.Helper()
	var opts []client.ClientOption
	if p.client != "" {
		opts = append(opts, client.WithRequestEditorFn(client.BearerAuth(p.client)))
	}
	api, err := client.NewClientWithResponses(p.base, opts...)
	require.NoError(p.t, err)
	return api
}

// exports waits for the embedded banner and returns its export lines as a
// map (INVENTORY_URL, ADMIN_TOKEN, CLIENT_TOKEN, ...), and makes api and
// call use the client credential it printed.
func (p *proc) exports() map[string]string {
	p.t.Helper()
	re := regexp.MustCompile(`(?m)^export ([A-Z_]+)=(\S+)$`)
	out := map[string]string{}
	require.Eventually(p.t, func() bool {
		stdout, _ := p.output()
		for _, m := range re.FindAllStringSubmatch(stdout, -1) {
			out[m[1]] = m[2]
		}
		return out["BOB_TOKEN"] != ""
	}, 10*time.Second, 20*time.Millisecond, "the banner prints export lines")
	p.client = out["CLIENT_TOKEN"]
	p.api = p.newAPI()
	return out
}

// buyer is the X-Buyer-Token the storefront signs for user.
func (p *proc) buyer(user string) string {
	p.t.Helper()
	tok, err := identity.Issue(p.buyerKey, user, time.Hour)
	require.NoError(p.t, err)
	return tok
}

// as is the request editor that makes a call act for user: the
// X-Buyer-Token the storefront signs for that user.
func (p *proc) as(user string) client.RequestEditorFn {
	p.t.Helper()
	return client.BuyerToken(p.buyer(user))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// stop sends SIGTERM and requires a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exited:
		require.NoError(p.t, err, "exit status 0 after SIGTERM")
	case <-time.After(30 * time.Second):
		p.t.Fatal("inventoryd did not exit after SIGTERM")
	}
}

// response is what every method of the generated client answers.
type response interface {
	StatusCode() int
	GetBody() []byte
}

// answer is a call through the generated client as the assertions read it:
// its status and its JSON body decoded into a map, so that an assertion
// compares the whole body the service sent (fields the client's types would
// drop included). It requires the call to have been answered and, where the
// document gives that status a JSON body, the client to have decoded it
// into the document's type (JSON200, JSON409, ...).
func (p *proc) answer(resp response, err error) (int, map[string]any) {
	p.t.Helper()
	require.NoError(p.t, err)
	st := resp.StatusCode()
	if typed := reflect.ValueOf(resp).Elem().FieldByName(fmt.Sprintf("JSON%d", st)); typed.IsValid() {
		require.False(p.t, typed.IsNil(), "the client decodes the %d answer into its type: %s", st, resp.GetBody())
	}
	var out map[string]any
	_ = json.Unmarshal(resp.GetBody(), &out)
	p.checkMessage(out)
	return st, out
}

// checkMessage requires an error answer's message to name no Go package.
func (p *proc) checkMessage(body map[string]any) {
	p.t.Helper()
	if e, ok := body["error"].(map[string]any); ok {
		require.NotRegexp(p.t, `(^|: )(inventory|stock|order|tokens|mq|identity|app): `, e["message"], "messages carry no Go package names")
	}
}

// call sends a request the generated client cannot send (a malformed body,
// a bad or spoofed header, a path taken as it is rather than built from
// typed parameters) and decodes the JSON answer into a map: with the client credential
// unless the request carries an Authorization, and, for a body naming a
// user_id, the buyer token the storefront signs for that user unless it
// carries one.
func (p *proc) call(method, path, body string, header ...string) (int, map[string]any) {
	p.t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	if h.Get("Authorization") == "" && p.client != "" {
		h.Set("Authorization", "Bearer "+p.client)
	}
	var b struct {
		UserID string `json:"user_id"`
	}
	if h.Get(identity.Header) == "" && p.buyerKey != "" && json.Unmarshal([]byte(body), &b) == nil && b.UserID != "" {
		h.Set(identity.Header, p.buyer(b.UserID))
	}
	resp, raw := p.send(method, path, body, h)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	p.checkMessage(out)
	return resp.StatusCode, out
}

// send sends exactly this request and returns the answer and its body.
func (p *proc) send(method, path, body string, h http.Header) (*http.Response, []byte) {
	p.t.Helper()
	req, err := http.NewRequest(method, p.base+path, bytes.NewBufferString(body))
	require.NoError(p.t, err)
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	require.NoError(p.t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, raw
}

// skuView is GET /v1/skus/{sku}'s answer for a limited SKU with onHand units
// of which reserved are held, and redis as Redis's available units.
func skuView(sku string, onHand, reserved, redis, perUserLimit int64) map[string]any {
	return map[string]any{"sku": sku, "on_hand": float64(onHand), "reserved": float64(reserved),
		"available": float64(onHand - reserved), "redis_available": float64(redis), "unlimited": false,
		"per_user_limit": float64(perUserLimit)}
}

// sku is GET /v1/skus/{sku}'s answer.
func (p *proc) sku(sku string) (int, map[string]any) {
	p.t.Helper()
	return p.answer(p.api.GetSKUWithResponse(p.t.Context(), sku, nil))
}

// requireSKU requires GET /v1/skus/{want["sku"]} to answer want now.
func (p *proc) requireSKU(want map[string]any) {
	p.t.Helper()
	st, got := p.sku(want["sku"].(string))
	require.Equal(p.t, 200, st, got)
	require.Equal(p.t, want, got)
}

// waitSKU polls GET /v1/skus/{want["sku"]} until it answers want (what an
// asynchronous step, such as the queue's sync, leads to), and fails with the
// last answer if it does not within the deadline.
func (p *proc) waitSKU(want map[string]any, within time.Duration, msg string) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, got := p.sku(want["sku"].(string))
		if st == 200 && reflect.DeepEqual(want, got) {
			return
		}
		if time.Now().After(deadline) {
			require.Equal(p.t, 200, st, got)
			require.Equal(p.t, want, got, "%s: not reached within %s", msg, within)
			p.t.Fatalf("%s: not reached within %s", msg, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitProjected waits until the lean sale's projector has projected every
// hold (arbiter.BacklogSQL): a test that reads orders,
// stock_reservations or movements straight from the database reads what
// the sale's commit recorded only once it is (the service itself reads
// both ways). It fails if the holds are not projected within 30 s.
func waitProjected(t *testing.T, db *sql.DB) {
	t.Helper()
	var dirty int
	deadline := time.Now().Add(30 * time.Second)
	for {
		require.NoError(t, db.QueryRow(arbiter.BacklogSQL).Scan(&dirty))
		if dirty == 0 {
			return
		}
		require.False(t, time.Now().After(deadline), "%d SKUs' or campaigns' holds not projected within 30s", dirty)
		time.Sleep(20 * time.Millisecond)
	}
}

// signedAt is a callback's parameters for one signed at time at (see
// signedBy).
func signedAt(at time.Time) *client.PaymentCallbackParams {
	return &client.PaymentCallbackParams{XTimestamp: strconv.FormatInt(at.Unix(), 10)}
}

// signedBy signs a callback as the payment provider does: X-Signature over
// the request's X-Timestamp and the body the client sends.
func signedBy(secret string) client.RequestEditorFn {
	return func(_ context.Context, req *http.Request) error {
		body, err := req.GetBody()
		if err != nil {
			return err
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			return err
		}
		req.Header.Set("X-Signature", hex.EncodeToString(httpapi.Sign(secret, req.Header.Get("X-Timestamp"), raw)))
		return nil
	}
}

// signed returns callback headers for body signed with secret at time at.
func signed(secret string, at time.Time, body string) []string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return []string{"X-Timestamp", ts, "X-Signature", hex.EncodeToString(httpapi.Sign(secret, ts, []byte(body)))}
}

// errCode is the error code of an error answer.
func errCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}
