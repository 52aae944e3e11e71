//go:build !faultbugs

package groupcommit

// errLost and loseCommit are a deliberate bug's hooks in a faultbugs build
// (internal/testbugs); here no commit is lost.
var errLost error

func loseCommit() bool { return false }
