package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/app"
)

// readmePath is the README, from this package's directory.
const readmePath = "../../README.md"

// exampleBlock is a README example: a fenced sh block right after an
// <!-- example --> line.
type exampleBlock struct {
	line    int    // of the opening fence, 1-based
	heading string // the nearest heading above it
	script  string
}

var (
	exampleMarker = regexp.MustCompile(`(?m)^<!-- example -->[ \t]*$`)
	exampleFence  = regexp.MustCompile("(?s)\\A<!-- example -->[ \\t]*\\n```sh[ \\t]*\\n(.*?\\n)```[ \\t]*(?:\\n|\\z)")
	headingLine   = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// codeSpans are fenced code blocks and inline code.
var codeSpans = regexp.MustCompile("(?s)```.*?```|`[^`\n]*`")

// withoutCode blanks s's code (which may hold lines that look like headings,
// and brackets that are not links), keeping every offset and line.
func withoutCode(s string) string {
	return codeSpans.ReplaceAllStringFunc(s, func(code string) string {
		b := []byte(code)
		for i := range b {
			if b[i] != '\n' {
				b[i] = ' '
			}
		}
		return string(b)
	})
}

// exampleBlocks finds the README's examples, in order. A marker not followed
// at once by a fenced sh block fails the test: it would be an example that
// silently never runs.
func exampleBlocks(t *testing.T, readme string) []exampleBlock {
	t.Helper()
	var out []exampleBlock
	for _, loc := range exampleMarker.FindAllStringIndex(readme, -1) {
		line := strings.Count(readme[:loc[0]], "\n") + 2
		m := exampleFence.FindStringSubmatch(readme[loc[0]:])
		require.NotNil(t, m, "README.md:%d: <!-- example --> must be followed by a ```sh block", line-1)
		heading := ""
		if hs := headingLine.FindAllStringSubmatch(withoutCode(readme[:loc[0]]), -1); len(hs) > 0 {
			heading = hs[len(hs)-1][1]
		}
		out = append(out, exampleBlock{line: line, heading: heading, script: m[1]})
	}
	return out
}

// checkREADMEReferences requires the README to name nothing outside the
// repository: no relative path that climbs out of it, no absolute path of
// some machine, no URL but the local service's, and every link pointing at
// a file of the repository or a heading.
func checkREADMEReferences(t *testing.T, readme string) {
	t.Helper()
	lineOf := func(i int) int { return strings.Count(readme[:i], "\n") + 1 }
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`\.\./`),                                                   // a path out of the repository
		regexp.MustCompile(`(?i)\bfile:/`),                                            // a local file URL
		regexp.MustCompile(`(?:^|[\s(\x60])~/`),                                       // a home directory
		regexp.MustCompile(`(?:^|[\s(\x60"'])/(?:work|home|root|tmp|Users|srv|opt)/`), // an absolute path on some machine
	} {
		for _, loc := range bad.FindAllStringIndex(readme, -1) {
			t.Errorf("README.md:%d: %q points outside the repository", lineOf(loc[0]), readme[loc[0]:loc[1]])
		}
	}
	urls := regexp.MustCompile(`(?i)\b[a-z][a-z0-9+.-]*://[^\s<>()\x60"']+`)
	for _, loc := range urls.FindAllStringIndex(readme, -1) {
		raw := strings.TrimRight(readme[loc[0]:loc[1]], ".,;:!?") // the sentence's, not the URL's
		u, err := url.Parse(raw)
		if err != nil || !(u.Scheme == "http" || u.Scheme == "https" || u.Scheme == "redis") {
			t.Errorf("README.md:%d: %q is a URL outside the repository", lineOf(loc[0]), raw)
			continue
		}
		switch u.Hostname() {
		case "localhost", "127.0.0.1", "::1":
		default:
			t.Errorf("README.md:%d: %q is a URL outside the repository (only the local service may be named)", lineOf(loc[0]), raw)
		}
	}
	// Markdown links and images: [text](target). Code spans and blocks may
	// hold brackets and parentheses that are not links, so drop them first.
	prose := withoutCode(readme)
	links := regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]*)[^)]*\)`)
	for _, m := range links.FindAllStringSubmatchIndex(prose, -1) {
		target := prose[m[2]:m[3]]
		path, _, _ := strings.Cut(target, "#")
		switch {
		case path == "", strings.Contains(target, "://"): // a heading; a URL is checked above
		case strings.HasPrefix(path, "/"):
			t.Errorf("README.md:%d: the link %q is an absolute path", lineOf(m[0]), target)
		default:
			if _, err := os.Stat(filepath.Join(filepath.Dir(readmePath), filepath.FromSlash(path))); err != nil {
				t.Errorf("README.md:%d: the link %q names no file of the repository", lineOf(m[0]), target)
			}
		}
	}
}

// checkREADMEAnchors requires every link to a heading (#anchor) to name a
// heading of the README, by GitHub's rule: lower case, punctuation dropped,
// spaces as hyphens.
func checkREADMEAnchors(t *testing.T, readme string) {
	t.Helper()
	prose := withoutCode(readme)
	slugs := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, h := range headingLine.FindAllStringSubmatch(prose, -1) {
		slugs[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h[1]), ""), " ", "-")] = true
	}
	for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(prose, -1) {
		if !slugs[m[1]] {
			t.Errorf("README.md links to #%s, which is no heading of it", m[1])
		}
	}
}

// Every example of the README runs as it is against what `make run` starts
// (the real binary in embedded mode), with only the banner's export lines
// and PATH in its environment: each block in order under bash -euo pipefail,
// so a failing command or a check (jq -e, test, grep) that does not hold
// fails the test.
func TestREADMEExamples(t *testing.T) {
	raw, err := os.ReadFile(readmePath)
	require.NoError(t, err)
	readme := string(raw)
	t.Run("stays in the repository", func(t *testing.T) { checkREADMEReferences(t, readme) })
	t.Run("links to its own headings", func(t *testing.T) { checkREADMEAnchors(t, readme) })
	t.Run("states the Go it needs", func(t *testing.T) {
		mod, err := os.ReadFile(filepath.Join(filepath.Dir(readmePath), "go.mod"))
		require.NoError(t, err)
		goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
		require.NotNil(t, goLine)
		require.Contains(t, readme, "You need Go "+string(goLine[1])+" or later", "the quick start states go.mod's Go")
	})
	t.Run("documents every variable", func(t *testing.T) {
		typ := reflect.TypeFor[app.Config]()
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("env"), ",")
			require.Contains(t, readme, "| `"+name+"` |", "the README's configuration table has a row for %s", name)
		}
	})
	blocks := exampleBlocks(t, readme)
	require.GreaterOrEqual(t, len(blocks), 8, "the README's examples are marked <!-- example --> before a ```sh block")
	t.Run("runs every call of the API", func(t *testing.T) {
		// A block that calls the service and is not marked would never run.
		marked := 0
		for _, loc := range regexp.MustCompile("(?s)```sh\n.*?```").FindAllStringIndex(readme, -1) {
			block := readme[loc[0]:loc[1]]
			if !strings.Contains(block, "curl ") {
				continue
			}
			if !strings.HasSuffix(strings.TrimRight(readme[:loc[0]], " \t\n"), "<!-- example -->") {
				t.Errorf("README.md:%d: a block that calls the API is not marked <!-- example -->", strings.Count(readme[:loc[0]], "\n")+1)
			}
			marked++
		}
		require.Equal(t, len(blocks), marked, "every example calls the API")
	})
	for _, tool := range []string{"bash", "curl", "jq", "openssl"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "the README's examples need %s (scripts/up.sh installs it)", tool)
	}

	p := start(t)
	exports := p.exports()
	for _, name := range []string{"INVENTORY_URL", "ADMIN_TOKEN", "CLIENT_TOKEN", "PAYMENT_SECRET", "BUYER_KEY", "ALICE_TOKEN", "BOB_TOKEN"} {
		require.NotEmpty(t, exports[name], "the banner exports %s", name)
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range exports {
		env = append(env, k+"="+v)
	}

	for _, b := range blocks {
		name := fmt.Sprintf("README.md:%d", b.line)
		ok := t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.script)
			cmd.Env = env
			cmd.Dir = t.TempDir() // a block that writes files leaves nothing in the repository
			out, err := cmd.CombinedOutput()
			if err != nil {
				_, stderr := p.output()
				t.Fatalf("the example at README.md:%d (under %q) failed: %v\n--- its output:\n%s\n--- the block:\n%s--- the service's log (tail):\n%s",
					b.line, b.heading, err, out, b.script, tail(stderr, 20))
			}
			t.Logf("output:\n%s", out)
		})
		if !ok {
			break // the blocks after it build on its state: their failures would mislead
		}
	}
	p.stop()
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
