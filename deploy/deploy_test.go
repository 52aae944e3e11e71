// Package deploy_test checks what operators load beside the service: the
// Prometheus alerting rules (with promtool, Debian's, as Prometheus itself
// reads them) and the Grafana dashboard, and that every query in either
// names only metrics, and labels, that inventoryd exports: the list comes
// from scraping /metrics of a running embedded inventoryd, not from a copy.
package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/identity"
)

const (
	rulesFile     = "prometheus/alerts.yml"
	rulesTestFile = "prometheus/alerts_test.yml"
	configFile    = "prometheus/prometheus.yml"
	dashboardFile = "grafana/inventory.json"
)

// promtool is Debian's (package prometheus), which scripts/up.sh installs
// for make test. Missing, it fails the test: the rules are not checked.
func promtool(t *testing.T, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is needed to check the alerting rules; scripts/up.sh installs it "+
		"(make test runs it; by hand: apt-get install --no-install-recommends prometheus)")
	out, err := exec.Command(path, args...).CombinedOutput()
	return string(out), err
}

// The rules pass promtool's own checks and unit tests, and the example
// configuration that loads them is valid.
func TestAlertingRulesPromtool(t *testing.T) {
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"test", "rules", rulesTestFile},
		{"check", "config", configFile},
	} {
		out, err := promtool(t, args...)
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// promtool check rules is not a formality: a broken rule fails it.
func TestPromtoolRefusesABrokenRule(t *testing.T) {
	rules, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	const good = "sum without (instance) (increase(inventory_mq_anomalies_total[10m])) > 0"
	require.Contains(t, string(rules), good)
	for name, broken := range map[string]string{
		"unbalanced":  strings.Replace(string(rules), good, "sum without (instance) (increase(inventory_mq_anomalies_total[10m]) > 0", 1),
		"no duration": strings.Replace(string(rules), good, "increase(inventory_mq_anomalies_total) > 0", 1),
		"bad for":     strings.Replace(string(rules), "for: 5m", "for: five minutes", 1),
	} {
		path := filepath.Join(t.TempDir(), "alerts.yml")
		require.NoError(t, os.WriteFile(path, []byte(broken), 0o644))
		out, err := promtool(t, "check", "rules", path)
		require.Error(t, err, "%s: promtool check rules passed a broken rule:\n%s", name, out)
	}
}

// Every alert says what to do and how urgent it is.
func TestAlertsAreActionable(t *testing.T) {
	rules := loadRules(t)
	require.NotEmpty(t, rules)
	for _, r := range rules {
		require.NotEmpty(t, r.Alert, "only alerting rules here: %q", r.Expr)
		require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], "%s: severity", r.Alert)
		require.NotEmpty(t, r.Annotations["summary"], "%s: summary", r.Alert)
		require.Greater(t, len(r.Annotations["description"]), 80, "%s: a description saying what to do", r.Alert)
	}
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.Alert
	}
	// What an operator must act on (issue 21): anomalies, sync lag, drift
	// found by realign, the 503 rate, a dependency down.
	for _, want := range []string{"InventoryStockAnomalies", "InventorySyncLagging", "InventoryRedisDriftRealigned",
		"InventoryHigh503Rate", "InventoryDependencyDown"} {
		require.Contains(t, names, want)
	}
}

// Every query of the rules and the dashboard names metrics and labels the
// service exports, as a scrape of the running service shows them.
func TestQueriesNameExportedMetrics(t *testing.T) {
	exported := scrapeEmbedded(t)
	for _, r := range loadRules(t) {
		require.NoError(t, checkExpr(exported, r.Expr), "alert %s", r.Alert)
	}
	queries, err := dashboardQueries(dashboardFile)
	require.NoError(t, err)
	require.Greater(t, len(queries), 20)
	for _, q := range queries {
		require.NoError(t, checkExpr(exported, q.expr), "dashboard %s", q.where)
	}
}

// The check catches what it is there for: a metric or label the service
// does not export, in a rule or in a dashboard, and a dashboard variable the
// test does not know how to stand in for.
func TestCheckCatchesUnknownNames(t *testing.T) {
	exported := scrapeEmbedded(t)
	for _, ok := range []string{
		`sum by (result) (rate(inventory_deductions_total{result="ok"}[5m]))`,
		`histogram_quantile(0.99, sum by (le) (rate(inventory_http_request_duration_seconds_bucket{route="/v1/orders"}[5m])))`,
		`inventory_release_latency_seconds_count`,
		`up{job="inventory"} == 0`,
	} {
		require.NoError(t, checkExpr(exported, ok), ok)
	}
	for _, bad := range []string{
		`rate(inventory_reservations_total[5m])`,                      // no such metric
		`inventory_stock_deducted`,                                    // a counter without _total
		`inventory_mq_lag_seconds_bucket`,                             // a gauge has no buckets
		`sum(rate(inventory_deductions_total{reslt="ok"}[5m]))`,       // no such label
		`sum by (code) (rate(inventory_orders_total[5m]))`,            // grouped by a label it lacks
		`inventory_mq_backlog > on (sku) inventory_orders_pending`,    // matched on a label neither has
		`sum(rate(inventory_deductions_total[5m])) / inventory_bogus`, // one unknown name among known ones
		`sum(rate(inventory_deductions_total[5m]`,                     // not PromQL
	} {
		require.Error(t, checkExpr(exported, bad), bad)
	}

	// The same through a dashboard file: a panel with a bogus metric.
	dash, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	for name, edit := range map[string][2]string{
		"bogus metric":   {"inventory_mq_backlog{", "inventory_mq_backlogs{"},
		"bogus variable": {"[$__rate_interval]", "[$window]"},
		"bogus template": {"label_values(inventory_stock_deducted_total, instance)", "label_values(inventory_stock_deductions_total, instance)"},
		"bogus label":    {`status=~\"409|429|503\"`, `code=~\"409|429|503\"`},
	} {
		require.True(t, strings.Contains(string(dash), edit[0]), "%s: the dashboard has %s", name, edit[0])
		path := filepath.Join(t.TempDir(), "inventory.json")
		require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(dash), edit[0], edit[1], 1)), 0o644))
		queries, err := dashboardQueries(path)
		if err == nil {
			for _, q := range queries {
				if err = checkExpr(exported, q.expr); err != nil {
					break
				}
			}
		}
		require.Error(t, err, name)
		t.Logf("%s: %v", name, err)
	}
}

// --- the rules ---

type rule struct {
	Alert, Record, Expr string
	For                 string
	Labels, Annotations map[string]string
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Name  string
			Rules []rule
		}
	}
	require.NoError(t, yaml.Unmarshal(b, &f))
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// --- the dashboard ---

type query struct{ where, expr string }

// Grafana's variables in queries, and what stands in for each when the
// query is parsed. A variable not listed is an error.
var variables = []struct{ name, value string }{
	{"$__rate_interval", "5m"},
	{"$__interval", "1m"},
	{"$__range", "1h"},
	{"${instance}", ".*"},
	{"$instance", ".*"},
}

var labelValues = regexp.MustCompile(`^label_values\(\s*(.+?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// dashboardQueries reads every PromQL query of the dashboard: each panel's
// targets (rows' nested panels too) and each query variable's.
func dashboardQueries(path string) ([]query, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels     []panel
		Templating struct {
			List []struct {
				Name, Type, Definition string
				Query                  any
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []query
	ids := map[int]bool{}
	var walk func([]panel) error
	walk = func(ps []panel) error {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if ids[p.ID] {
				return fmt.Errorf("%s: id used twice", where)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				if err := walk(p.Panels); err != nil {
					return err
				}
				continue
			}
			if len(p.Targets) == 0 {
				return fmt.Errorf("%s: no query", where)
			}
			if p.Datasource.UID != "${datasource}" {
				return fmt.Errorf("%s: data source %q, not the dashboard's ${datasource}", where, p.Datasource.UID)
			}
			for _, tg := range p.Targets {
				expr, err := substitute(tg.Expr)
				if err != nil {
					return fmt.Errorf("%s, query %s: %w", where, tg.RefID, err)
				}
				out = append(out, query{fmt.Sprintf("%s, query %s", where, tg.RefID), expr})
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		// label_values(selector, label): the selector must be exported, and
		// with the label; Grafana shows the definition, and runs the query.
		for _, q := range []string{q, v.Definition} {
			if q == "" {
				continue
			}
			m := labelValues.FindStringSubmatch(strings.TrimSpace(q))
			if m == nil {
				return nil, fmt.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, q)
			}
			out = append(out, query{"variable " + v.Name, fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
		}
	}
	return out, nil
}

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource struct{ UID string }
	Targets    []struct {
		RefID string
		Expr  string
	}
	Panels []panel
}

func substitute(expr string) (string, error) {
	if strings.TrimSpace(expr) == "" {
		return "", fmt.Errorf("empty query")
	}
	for _, v := range variables {
		expr = strings.ReplaceAll(expr, v.name, v.value)
	}
	if i := strings.IndexByte(expr, '$'); i >= 0 {
		return "", fmt.Errorf("unknown variable at %q", expr[i:])
	}
	return expr, nil
}

// --- what the service exports ---

// exports is every series name the service's /metrics gives, with the
// label names each carries (as Prometheus stores them: a histogram's
// _bucket, _sum and _count; a counter's name as exposed, with _total).
type exports map[string]map[string]bool

// Labels every series has once scraped (the target's), and what Prometheus
// itself records for each target.
var (
	targetLabels  = []string{"instance", "job"}
	prometheusOwn = exports{"up": {}}
)

// checkExpr parses expr as PromQL and checks that every selector names an
// exported series, that its matchers name labels that series has, and that
// every grouping (by, without, on, ignoring, group_left/right) names a
// label of a series the expression selects.
func checkExpr(ex exports, expr string) error {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return fmt.Errorf("%q: %w", expr, err)
	}
	var errs []string
	selected := map[string]bool{"__name__": true}
	for _, l := range targetLabels {
		selected[l] = true
	}
	var groupings [][]string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			labels, ok := ex[n.Name]
			if !ok {
				labels, ok = prometheusOwn[n.Name]
			}
			if !ok {
				errs = append(errs, fmt.Sprintf("metric %q is not exported by inventoryd", n.Name))
				return nil
			}
			for l := range labels {
				selected[l] = true
			}
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" && !labels[m.Name] && !slices.Contains(targetLabels, m.Name) {
					errs = append(errs, fmt.Sprintf("%s has no label %q", n.Name, m.Name))
				}
			}
		case *parser.AggregateExpr:
			groupings = append(groupings, n.Grouping)
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				groupings = append(groupings, n.VectorMatching.MatchingLabels, n.VectorMatching.Include)
			}
		}
		return nil
	})
	for _, g := range groupings {
		for _, l := range g {
			if !selected[l] {
				errs = append(errs, fmt.Sprintf("no series in the expression has label %q", l))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%q: %s", expr, strings.Join(errs, "; "))
	}
	return nil
}

// scrapeEmbedded starts inventoryd's embedded default in-process (the real
// wiring: app.New builds the same registry as in production), makes the
// requests that make each labelled metric appear (an order, a token-API
// reservation), and reads /metrics.
func scrapeEmbedded(t *testing.T) exports {
	t.Helper()
	cfg, err := app.ParseConfig()
	require.NoError(t, err)
	cfg.RedisURL, cfg.RedisCluster, cfg.MySQLDSN, cfg.RocketMQNamesrv = "", nil, "", nil // embedded, whatever the environment says
	cfg.HTTPAddr = "127.0.0.1:0"
	// A subscription to a receiver that is not there: its oldest
	// undelivered event's age is labelled with it.
	cfg.WebhookAllowHTTP, cfg.WebhookAllowPrivate = true, true
	ctx := context.Background()
	a, err := app.New(ctx, cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.NoError(t, a.Seed(ctx))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, a.Shutdown(ctx))
	})
	base := "http://" + a.Addr()
	call := func(method, path, body string, header ...string) (int, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	client := "Bearer " + a.Cfg.ClientTokens[0]
	buyer, err := identity.IssueFor(a.Cfg.BuyerKey, "alice", identity.DefaultIssuer, identity.DefaultAudience, time.Hour)
	require.NoError(t, err)
	st, body := call("POST", "/v1/orders", `{"items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, "Authorization", client, identity.Header, buyer)
	require.Equal(t, http.StatusCreated, st, "an order, for inventory_orders_total and inventory_deductions_total: %s", body)
	st, body = call("POST", "/v1/stock/deduct", `{"sku":"DEMO-TSHIRT","qty":1,"token":"deploy-test"}`, "Authorization", client)
	require.Equal(t, http.StatusOK, st, "a token-API reservation: %s", body)
	st, body = call("PUT", "/v1/webhooks/deploy-test", `{"url":"http://127.0.0.1:9/","secret":"`+strings.Repeat("0123456789abcdef", 2)+
		`","events":["sku.sold_out"]}`, "Authorization", "Bearer "+a.Cfg.AdminToken)
	require.Equal(t, http.StatusOK, st, "a webhook subscription, for inventory_webhook_oldest_undelivered_seconds: %s", body)

	st, body = call("GET", "/metrics", "")
	require.Equal(t, http.StatusOK, st)
	text := expfmt.NewTextParser(model.UTF8Validation)
	families, err := text.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	// The two admissions went to Redis one after another: two pipelines of one.
	for _, name := range []string{"inventory_stock_admission_pipelines_total", "inventory_stock_admissions_pipelined_total"} {
		require.Contains(t, families, name)
		require.EqualValues(t, 2, families[name].GetMetric()[0].GetCounter().GetValue(), name)
	}
	ex := exports{}
	add := func(name string, labels map[string]bool, extra ...string) {
		if ex[name] == nil {
			ex[name] = map[string]bool{}
		}
		for l := range labels {
			ex[name][l] = true
		}
		for _, l := range extra {
			ex[name][l] = true
		}
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]bool{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = true
			}
			switch f.GetType().String() {
			case "HISTOGRAM", "GAUGE_HISTOGRAM":
				add(name+"_bucket", labels, "le")
				add(name+"_sum", labels)
				add(name+"_count", labels)
			case "SUMMARY":
				add(name, labels, "quantile")
				add(name+"_sum", labels)
				add(name+"_count", labels)
			default:
				add(name, labels)
			}
		}
	}
	// What the dashboard and rules rely on is there at all (else the scrape
	// above, not the files, would be wrong).
	for _, name := range []string{"inventory_http_request_duration_seconds_bucket", "inventory_deductions_total",
		"inventory_orders_total", "inventory_mq_lag_seconds", "inventory_release_latency_seconds_bucket", "process_cpu_seconds_total",
		"inventory_webhook_deliveries_total", "inventory_webhook_oldest_undelivered_seconds"} {
		require.Contains(t, ex, name, "the scrape")
	}
	return ex
}
