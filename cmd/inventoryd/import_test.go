package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/client"
)

// The count file a user has, as import counts reads it: with or without a
// header, unshipped optional; every bad line named, and nothing sent.
func TestReadCountFile(t *testing.T) {
	rows, err := readCountFile([]byte("sku,counted,unshipped\nA,10\n B , 3 , 1 \n\nC,0,\n"))
	require.NoError(t, err)
	one := int64(1)
	require.Equal(t, []countRow{{SKU: "A", Counted: 10}, {SKU: "B", Counted: 3, Unshipped: &one}, {SKU: "C"}}, rows)
	rows, err = readCountFile([]byte("A,10\n"))
	require.NoError(t, err)
	require.Equal(t, []countRow{{SKU: "A", Counted: 10}}, rows)

	for file, msg := range map[string]string{
		"A,10\nB,-1\n":                     "line 2: counted \"-1\" is not a whole number of units (0 or more)",
		"A,ten\n":                          "line 1: counted \"ten\" is not a whole number of units",
		"A,1.5\n":                          "line 1: counted \"1.5\" is not a whole number",
		"A,1\nA,2\n":                       "line 2: A is counted on line 1 too",
		"A,1,2,WH1\n":                      "line 1: a location column is not supported yet",
		"sku,counted,unshipped,location\n": "line 1: a location column is not supported yet",
		"sku,qty\n":                        `line 1: the header names "qty" where "counted" goes`,
		"A\n":                              "line 1: a line is sku,counted[,unshipped]",
		"A{b},1\n":                         "line 1: ",
		"":                                 "no lines to count",
	} {
		_, err := readCountFile([]byte(file))
		require.ErrorContains(t, err, msg, "%q", file)
	}
}

// A resumed import sends the pages the service has as they were, then the
// rest.
func TestCountPages(t *testing.T) {
	require.Equal(t, []countPageSpan{{0, 4}, {4, 4}, {8, 2}}, countPages(10, 4, nil))
	before := &client.CountProgress{Pages: []struct {
		Applied int64 `json:"applied"`
		Lines   int64 `json:"lines"`
		Offset  int64 `json:"offset"`
	}{{Applied: 3, Lines: 3, Offset: 0}, {Applied: 1, Lines: 3, Offset: 3}}}
	require.Equal(t, []countPageSpan{{0, 3}, {3, 3}, {6, 4}}, countPages(10, 4, before))
}

// import counts against the real binary: a file applied with a summary of
// what was corrected, short and unknown; run again, it changes nothing and
// says the same; a bad file sends nothing.
func TestImportCounts(t *testing.T) {
	p := start(t)
	env := p.exports()
	admin := []string{"Authorization", "Bearer " + env["ADMIN_TOKEN"]}
	code, _ := p.call("PUT", "/v1/skus/IMP-A", `{"stock":10}`, admin...)
	require.Equal(t, 200, code)
	code, _ = p.call("PUT", "/v1/skus/IMP-B", `{"stock":10}`, admin...)
	require.Equal(t, 200, code)
	code, body := p.call("POST", "/v1/orders", `{"items":[{"sku":"IMP-B","qty":6}]}`, "X-Buyer-Token", env["ALICE_TOKEN"])
	require.Equal(t, 201, code, body)
	time.Sleep(5 * time.Millisecond)
	at := time.Now().UTC().Format(time.RFC3339Nano)
	time.Sleep(5 * time.Millisecond)

	dir := t.TempDir()
	file := filepath.Join(dir, "counts.csv")
	require.NoError(t, os.WriteFile(file, []byte("sku,counted,unshipped\nIMP-A,8\nIMP-B,2\nIMP-NONE,4\n"), 0o600))
	run := func(args ...string) (string, string, error) {
		cmd := exec.Command(binary(t), append([]string{"import", "counts", file, "--counted-at", at, "--page", "2"}, args...)...)
		cmd.Env = []string{"INVENTORY_URL=" + env["INVENTORY_URL"], "ADMIN_TOKEN=" + env["ADMIN_TOKEN"]}
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	out, errOut, err := run("--count-id", "imp-1")
	require.NoError(t, err, errOut)
	require.Contains(t, errOut, "count imp-1: 3 lines counted at")
	require.Contains(t, errOut, "2/3 lines applied\n3/3 lines applied\n", "progress, one line per page off a terminal")
	want := "count imp-1: 3 lines applied: 1 corrected, 0 unchanged, 1 short, 1 unknown SKUs; on_hand +0 -6 units, 4 units short\n" +
		"short (recorded as anomalies and announced as sku.shortage):\n" +
		"  IMP-B: 4 short (counted 2, 0 unshipped; on_hand held at 6)\n" +
		"unknown SKUs (nothing applied):\n  IMP-NONE\n"
	require.Equal(t, want, out)
	p.requireSKU(map[string]any{"sku": "IMP-A", "on_hand": 8.0, "reserved": 0.0, "available": 8.0, "redis_available": 8.0, "unlimited": false, "per_user_limit": 0.0})

	out, errOut, err = run("--count-id", "imp-1")
	require.NoError(t, err, errOut)
	require.Contains(t, errOut, "3 of them applied before: resuming")
	require.Equal(t, want, out, "a resumed import applies nothing again and says the same")
	p.requireSKU(map[string]any{"sku": "IMP-A", "on_hand": 8.0, "reserved": 0.0, "available": 8.0, "redis_available": 8.0, "unlimited": false, "per_user_limit": 0.0})

	require.NoError(t, os.WriteFile(file, []byte("IMP-A,5\nIMP-B,x\n"), 0o600))
	_, errOut, err = run("--count-id", "imp-2")
	require.Error(t, err)
	require.Contains(t, errOut, `line 2: counted "x" is not a whole number of units (0 or more) (nothing was sent)`)
	code, _ = p.call("GET", "/v1/stock/counts/imp-2", "", admin...)
	require.Equal(t, 404, code)
}
