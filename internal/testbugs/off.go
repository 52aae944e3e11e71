//go:build !faultbugs

package testbugs

// On is false outside a faultbugs build: no bug is compiled in.
func On(string) bool { return false }
