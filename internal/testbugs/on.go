//go:build faultbugs

package testbugs

import "os"

var bug = os.Getenv(Env)

// On reports whether bug is the one switched on.
func On(name string) bool { return bug == name }
