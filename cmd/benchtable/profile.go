package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
)

// profiled runs fn under the CPU profiler when -cpuprofile is set: the whole
// of it, or with -cpuprofile-phases only the phases whose name matches (see
// profilePhase), their profiles merged into one file at the end.
func profiled(fn func() webRun) webRun { return profiledAt(*cpuProf, fn) }

// campaignProfile is where the campaign group's CPU profile goes: beside
// -cpuprofile, so the HTTP group's stays the sale's alone.
func campaignProfile() string {
	if *cpuProf == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(*cpuProf), "campaign.cpu.pprof")
}

// profiledAt is profiled, writing the profile to path ("": none).
func profiledAt(path string, fn func() webRun) webRun {
	if path == "" {
		return fn()
	}
	must(os.MkdirAll(filepath.Dir(path), 0o755))
	// And the mutex profile beside it: where the HTTP phases wait on locks
	// (the group commit's queue, the connection pools).
	runtime.SetMutexProfileFraction(5)
	defer func() {
		mf, err := os.Create(strings.TrimSuffix(path, ".cpu.pprof") + ".mutex.pprof")
		must(err)
		defer mf.Close()
		must(pprof.Lookup("mutex").WriteTo(mf, 0))
		runtime.SetMutexProfileFraction(0)
	}()
	if *profPhase != "" {
		phaseProfiles.match = regexp.MustCompile(*profPhase)
		phaseProfiles.parts = nil
		defer mergePhaseProfiles(path)
		return fn()
	}
	f, err := os.Create(path)
	must(err)
	defer f.Close()
	must(pprof.StartCPUProfile(f))
	defer pprof.StopCPUProfile()
	return fn()
}

// phaseProfiles holds the CPU profiles of the phases -cpuprofile-phases
// picked, one per phase (phases run one after another, as the profiler
// can only run once at a time).
var phaseProfiles struct {
	match *regexp.Regexp // nil: no per-phase profiling
	parts [][]byte
}

// profilePhase starts the CPU profiler for phase name if -cpuprofile-phases
// picks it and returns what stops it: `defer profilePhase(name)()`.
func profilePhase(name string) func() {
	if phaseProfiles.match == nil || !phaseProfiles.match.MatchString(name) {
		return func() {}
	}
	var buf bytes.Buffer
	if pprof.StartCPUProfile(&buf) != nil {
		return func() {} // one is running already
	}
	return func() {
		pprof.StopCPUProfile()
		phaseProfiles.parts = append(phaseProfiles.parts, buf.Bytes())
	}
}

// mergePhaseProfiles writes the picked phases' profiles to path, merged
// by `go tool pprof -proto` when there are several.
func mergePhaseProfiles(path string) { mergeProfiles(path, phaseProfiles.parts) }

// mergeProfiles writes parts (CPU profiles) to path, merged by `go tool
// pprof -proto` when there are several; none writes nothing.
func mergeProfiles(path string, parts [][]byte) {
	switch len(parts) {
	case 0:
		return
	case 1:
		must(os.WriteFile(path, parts[0], 0o644))
		return
	}
	var paths []string
	for i, p := range parts {
		part := path + ".part" + strconv.Itoa(i)
		must(os.WriteFile(part, p, 0o644))
		defer os.Remove(part)
		paths = append(paths, part)
	}
	merged, err := exec.Command("go", append([]string{"tool", "pprof", "-proto"}, paths...)...).Output()
	must(err)
	must(os.WriteFile(path, merged, 0o644))
}
