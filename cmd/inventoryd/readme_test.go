package main

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/app"
)

// exampleDocs are the documents whose examples run, in this order, against
// one service: the README's quick start first, then docs/examples.md, whose
// blocks build on it as a reader pasting them in order would.
var exampleDocs = []string{"README.md", "docs/examples.md"}

// doc is a Markdown file of the repository: name is its path from the
// repository's root, slash-separated, as messages name it.
type doc struct {
	name string
	text string
}

func readDoc(t *testing.T, name string) doc {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(name)))
	require.NoError(t, err)
	return doc{name: name, text: string(raw)}
}

// docsToCheck are the README and every page of docs/: what must stay in the
// repository and whose links must resolve.
func docsToCheck(t *testing.T) []doc {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	docs := []doc{readDoc(t, "README.md")}
	for _, p := range pages {
		docs = append(docs, readDoc(t, "docs/"+filepath.Base(p)))
	}
	return docs
}

// exampleBlock is a documented example: a fenced sh block right after an
// <!-- example --> line.
type exampleBlock struct {
	doc     string // the file it is in
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

// exampleBlocks finds a document's examples, in order. A marker not followed
// at once by a fenced sh block fails the test: it would be an example that
// silently never runs.
func exampleBlocks(t *testing.T, d doc) []exampleBlock {
	t.Helper()
	var out []exampleBlock
	for _, loc := range exampleMarker.FindAllStringIndex(d.text, -1) {
		line := strings.Count(d.text[:loc[0]], "\n") + 2
		m := exampleFence.FindStringSubmatch(d.text[loc[0]:])
		require.NotNil(t, m, "%s:%d: <!-- example --> must be followed by a ```sh block", d.name, line-1)
		heading := ""
		if hs := headingLine.FindAllStringSubmatch(withoutCode(d.text[:loc[0]]), -1); len(hs) > 0 {
			heading = hs[len(hs)-1][1]
		}
		out = append(out, exampleBlock{doc: d.name, line: line, heading: heading, script: m[1]})
	}
	return out
}

// mdLinks are Markdown links and images, [text](target), in text whose code
// is blanked (code may hold brackets and parentheses that are not links).
var mdLinks = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]*)[^)]*\)`)

// checkReferences requires a document to name nothing outside the
// repository: no relative path that climbs out of it, no absolute path of
// some machine, no URL but the local service's, and every link pointing at
// a file of the repository (relative to the document, as GitHub reads it)
// or a heading.
func checkReferences(t *testing.T, d doc) {
	t.Helper()
	lineOf := func(i int) int { return strings.Count(d.text[:i], "\n") + 1 }
	// Links first: one that stays in the repository may climb out of the
	// document's folder (docs/ links ../README.md), so the path checks below
	// read the text with those targets blanked.
	prose := withoutCode(d.text)
	checked := []byte(d.text)
	for _, m := range mdLinks.FindAllStringSubmatchIndex(prose, -1) {
		target := prose[m[2]:m[3]]
		file, _, _ := strings.Cut(target, "#")
		switch {
		case file == "", strings.Contains(target, "://"): // a heading; a URL is checked below
		case strings.HasPrefix(file, "/"):
			t.Errorf("%s:%d: the link %q is an absolute path", d.name, lineOf(m[0]), target)
		default:
			resolved := path.Join(path.Dir(d.name), file)
			if resolved == ".." || strings.HasPrefix(resolved, "../") {
				continue // left in checked: reported below as a path out of the repository
			}
			if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(resolved))); err != nil {
				t.Errorf("%s:%d: the link %q names no file of the repository", d.name, lineOf(m[0]), target)
			}
			for i := m[2]; i < m[3]; i++ {
				checked[i] = ' '
			}
		}
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`\.\./`),                                                   // a path out of the repository
		regexp.MustCompile(`(?i)\bfile:/`),                                            // a local file URL
		regexp.MustCompile(`(?:^|[\s(\x60])~/`),                                       // a home directory
		regexp.MustCompile(`(?:^|[\s(\x60"'])/(?:work|home|root|tmp|Users|srv|opt)/`), // an absolute path on some machine
	} {
		for _, loc := range bad.FindAllIndex(checked, -1) {
			t.Errorf("%s:%d: %q points outside the repository", d.name, lineOf(loc[0]), d.text[loc[0]:loc[1]])
		}
	}
	urls := regexp.MustCompile(`(?i)\b[a-z][a-z0-9+.-]*://[^\s<>()\x60"']+`)
	for _, loc := range urls.FindAllStringIndex(d.text, -1) {
		raw := strings.TrimRight(d.text[loc[0]:loc[1]], ".,;:!?") // the sentence's, not the URL's
		u, err := url.Parse(raw)
		if err != nil || !(u.Scheme == "http" || u.Scheme == "https" || u.Scheme == "redis") {
			t.Errorf("%s:%d: %q is a URL outside the repository", d.name, lineOf(loc[0]), raw)
			continue
		}
		switch u.Hostname() {
		case "localhost", "127.0.0.1", "::1":
		default:
			t.Errorf("%s:%d: %q is a URL outside the repository (only the local service may be named)", d.name, lineOf(loc[0]), raw)
		}
	}
}

// headingSlugs are the anchors of a document's headings, by GitHub's rule:
// lower case, punctuation dropped (inline code keeps its text), spaces as
// hyphens.
func headingSlugs(d doc) map[string]bool {
	slugs := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	// Headings are found with code blanked (a fenced block may hold lines
	// that look like headings) and read from the text itself.
	for _, m := range headingLine.FindAllStringSubmatchIndex(withoutCode(d.text), -1) {
		h := d.text[m[2]:m[3]]
		slugs[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
	}
	return slugs
}

// checkAnchors requires every link to a heading (#anchor, or file.md#anchor
// of a Markdown file of the repository) to name a heading of that file.
func checkAnchors(t *testing.T, d doc) {
	t.Helper()
	prose := withoutCode(d.text)
	for _, m := range mdLinks.FindAllStringSubmatch(prose, -1) {
		file, anchor, ok := strings.Cut(m[1], "#")
		if !ok || strings.Contains(m[1], "://") {
			continue
		}
		target := d
		if file != "" {
			resolved := path.Join(path.Dir(d.name), file)
			if !strings.HasSuffix(resolved, ".md") || strings.HasPrefix(resolved, "../") {
				continue
			}
			raw, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(resolved)))
			if err != nil {
				continue // checkReferences reports a missing file
			}
			target = doc{name: resolved, text: string(raw)}
		}
		if !headingSlugs(target)[anchor] {
			t.Errorf("%s links to %s#%s, which is no heading of %s", d.name, file, anchor, target.name)
		}
	}
}

// Every example of the README and docs/examples.md runs as it is against
// what `make run` starts (the real binary in embedded mode), with only the
// banner's export lines, PATH and Go's home in its environment: each block in order
// under bash -euo pipefail, so a failing command or a check (jq -e, test,
// grep) that does not hold fails the test. The README and every page of
// docs/ stay in the repository and link to files and headings that exist.
func TestREADMEExamples(t *testing.T) {
	readme := readDoc(t, "README.md")
	for _, d := range docsToCheck(t) {
		t.Run(d.name+" stays in the repository", func(t *testing.T) { checkReferences(t, d) })
		t.Run(d.name+" links to headings that exist", func(t *testing.T) { checkAnchors(t, d) })
	}
	t.Run("states the Go it needs", func(t *testing.T) {
		mod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
		require.NoError(t, err)
		goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
		require.NotNil(t, goLine)
		require.Contains(t, readme.text, "You need Go "+string(goLine[1])+" or later", "the README's quick start states go.mod's Go")
	})
	t.Run("documents every variable", func(t *testing.T) {
		typ := reflect.TypeFor[app.Config]()
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("env"), ",")
			require.Contains(t, readme.text, "| `"+name+"` |", "the README's configuration table has a row for %s", name)
		}
	})
	var blocks []exampleBlock
	for _, name := range exampleDocs {
		d := readDoc(t, name)
		found := exampleBlocks(t, d)
		blocks = append(blocks, found...)
		t.Run(name+" runs every call of the API", func(t *testing.T) {
			// A block that calls the service and is not marked would never run.
			marked := 0
			for _, loc := range regexp.MustCompile("(?s)```sh\n.*?```").FindAllStringIndex(d.text, -1) {
				block := d.text[loc[0]:loc[1]]
				if !strings.Contains(block, "curl ") {
					continue
				}
				if !strings.HasSuffix(strings.TrimRight(d.text[:loc[0]], " \t\n"), "<!-- example -->") {
					t.Errorf("%s:%d: a block that calls the API is not marked <!-- example -->", d.name, strings.Count(d.text[:loc[0]], "\n")+1)
				}
				marked++
			}
			require.Equal(t, len(found), marked, "every example calls the API")
		})
	}
	require.GreaterOrEqual(t, len(blocks), 9, "the examples are marked <!-- example --> before a ```sh block")
	for _, tool := range []string{"bash", "curl", "jq", "openssl"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "the examples need %s (scripts/up.sh installs it)", tool)
	}

	// Started as docs/examples.md says for its webhooks block: plain http
	// and a receiver on loopback allowed (the other blocks do not mind).
	p := start(t, "INVENTORY_WEBHOOK_ALLOW_HTTP=true", "INVENTORY_WEBHOOK_ALLOW_PRIVATE=true")
	exports := p.exports()
	for _, name := range []string{"INVENTORY_URL", "ADMIN_TOKEN", "CLIENT_TOKEN", "PAYMENT_SECRET", "BUYER_KEY", "ALICE_TOKEN", "BOB_TOKEN"} {
		require.NotEmpty(t, exports[name], "the banner exports %s", name)
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	// The webhooks block builds its receiver with go, which needs a home
	// (or a cache) as a reader's shell has.
	for _, name := range []string{"HOME", "GOCACHE", "GOPATH", "GOMODCACHE", "GOROOT"} {
		if v, ok := os.LookupEnv(name); ok {
			env = append(env, name+"="+v)
		}
	}
	for k, v := range exports {
		env = append(env, k+"="+v)
	}

	for _, b := range blocks {
		name := fmt.Sprintf("%s:%d", b.doc, b.line)
		ok := t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.script)
			cmd.Env = env
			cmd.Dir = t.TempDir() // a block that writes files leaves nothing in the repository
			out, err := cmd.CombinedOutput()
			if err != nil {
				_, stderr := p.output()
				t.Fatalf("the example at %s:%d (under %q) failed: %v\n--- its output:\n%s\n--- the block:\n%s--- the service's log (tail):\n%s",
					b.doc, b.line, b.heading, err, out, b.script, tail(stderr, 20))
			}
			t.Logf("output:\n%s", out)
		})
		if !ok {
			break // the blocks after it build on its state: their failures would mislead
		}
	}
	p.stop()
}

// The README's Go code is compiled code: each ```go block is, as it stands,
// the body of an Example function of client/example_test.go (which go vet
// and go test build against the generated client), so a change to the
// client that breaks the README's example breaks the build.
func TestREADMEGoExamples(t *testing.T) {
	readme := readDoc(t, "README.md")
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(readme.text, -1)
	require.NotEmpty(t, blocks, "the README shows the Go client")

	const examples = "client/example_test.go"
	src, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(examples)))
	require.NoError(t, err)
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, examples, src, 0)
	require.NoError(t, err)
	bodies := map[string]bool{}
	for _, decl := range file.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Example") {
			continue
		}
		// The statements between the braces, one tab less indented.
		body := string(src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
		body = strings.TrimPrefix(body, "\n")
		lines := strings.Split(body, "\n")
		for i, l := range lines {
			lines[i] = strings.TrimPrefix(l, "\t")
		}
		bodies[strings.Join(lines, "\n")] = true
	}
	for _, b := range blocks {
		require.True(t, bodies[b[1]], "a ```go block of README.md is not the body of an Example in %s as it stands there:\n%s", examples, b[1])
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
