package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"github.com/stretchr/testify/require"
)

// repoRoot is the repository, from this package's directory.
const repoRoot = "../.."

// makeSecrets runs what `make secrets` runs, writing dir/.env.
func makeSecrets(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "secrets.sh"), filepath.Join(dir, ".env")).CombinedOutput()
	require.NoError(t, err, string(out))
	return filepath.Join(dir, ".env")
}

// loadCompose reads docker-compose.yml as `docker compose` does from a
// directory holding it and dir's .env (if any): .env interpolated into the
// file, nothing from this process's environment.
func loadCompose(t *testing.T, dir string) (*types.Project, error) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "docker-compose.yml"), raw, 0o644))
	opts, err := cli.NewProjectOptions([]string{filepath.Join(dir, "docker-compose.yml")},
		cli.WithWorkingDirectory(dir), cli.WithEnvFiles(), cli.WithDotEnv)
	require.NoError(t, err)
	return opts.LoadProject(context.Background())
}

// The compose stack starts as shipped once `make secrets` wrote .env: every
// container running the service's image gets an environment that passes
// the service's own configuration check for its command (serve, migrate),
// run by the real binary with exactly that environment. One service builds
// the image, the others run it; without .env compose refuses to start and
// says to run make secrets.
func TestComposeEnvironmentPassesConfigCheck(t *testing.T) {
	dir := t.TempDir()
	env := makeSecrets(t, dir)
	info, err := os.Stat(env)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), ".env holds every secret: only its owner reads it")
	raw, err := os.ReadFile(env)
	require.NoError(t, err)
	hex64 := regexp.MustCompile(`^[0-9a-f]{64}$`)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, line)
		require.Regexp(t, hex64, v, k)
		require.False(t, seen[v], "%s repeats another secret", k)
		seen[v] = true
	}
	require.Len(t, seen, 5)
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "secrets.sh"), env).CombinedOutput()
	require.NoError(t, err, string(out))
	again, err := os.ReadFile(env)
	require.NoError(t, err)
	require.Equal(t, raw, again, "a second make secrets keeps the secrets in use")

	project, err := loadCompose(t, dir)
	require.NoError(t, err)

	// One image, built once.
	var builders, ours []types.ServiceConfig
	for _, s := range project.Services {
		if s.Build != nil {
			builders = append(builders, s)
		}
	}
	require.Len(t, builders, 1, "exactly one service builds the image")
	image := builders[0].Image
	require.NotEmpty(t, image, "the built image is named, so other services run it")
	for _, s := range project.Services {
		if s.Image == image {
			ours = append(ours, s)
			if s.Build == nil {
				require.Equal(t, types.PullPolicyNever, s.PullPolicy, "%s runs the built image and never pulls it", s.Name)
			}
		}
	}
	names := []string{}
	for _, s := range ours {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	require.Equal(t, []string{"inventoryd", "migrate"}, names)

	for _, s := range ours {
		command := "serve" // the image's entrypoint with no arguments
		if len(s.Command) > 0 {
			command = s.Command[0]
		}
		var environ []string
		for k, v := range s.Environment {
			require.NotNil(t, v, "%s: %s would come from the host's environment", s.Name, k)
			environ = append(environ, k+"="+*v)
		}
		cmd := exec.Command(binary(t), "config", "check", command)
		cmd.Env = environ
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s (%s) in its compose environment:\n%s", s.Name, command, out)
		require.Contains(t, string(out), "config: ok for "+command+": ", s.Name)
		for secret := range seen {
			require.NotContains(t, string(out), secret[:16], "config check prints no secret")
		}
		t.Logf("%s: %s", s.Name, out)
	}

	// Without .env, compose refuses and says what to do.
	_, err = loadCompose(t, t.TempDir())
	require.ErrorContains(t, err, "run make secrets first")
}

// The build context leaves out caches, binaries, history and secrets, and
// keeps the source; the Dockerfile builds with the Go of go.mod.
func TestDockerBuildContext(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	require.NoError(t, err)
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	require.NoError(t, err)
	pm, err := patternmatcher.New(patterns)
	require.NoError(t, err)
	for path, excluded := range map[string]bool{
		".cache/rocketmq-5.3.3/lib/rocketmq-broker-5.3.3.jar": true, "bin/inventoryd": true, ".git/HEAD": true,
		".env": true, "bench-results/results.md": true, "inventoryd": true,
		"go.mod": false, "go.sum": false, "cmd/inventoryd/main.go": false, "migrations/mysql/00001_init.sql": false,
		"internal/httpapi/openapi.yaml": false, "scripts/docker/broker.conf": false,
	} {
		got, err := pm.MatchesOrParentMatches(path)
		require.NoError(t, err)
		require.Equal(t, excluded, got, "%s excluded from the build context", path)
	}

	mod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	require.NoError(t, err)
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	require.NotNil(t, goLine)
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	require.Contains(t, string(dockerfile), "FROM golang:"+string(goLine[1])+" AS build", "the image builds with go.mod's Go")
}
