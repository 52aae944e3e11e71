//go:build faultbugs

package groupcommit

import (
	"errors"
	"sync/atomic"

	"github.com/acme/inventory/internal/testbugs"
)

var errLost = errors.New("groupcommit: testbugs.AckBeforeCommit rolled the batch back")

var batches atomic.Int64

// loseCommit, with testbugs.AckBeforeCommit on, has one batch in four
// answered as committed while its transaction is rolled back.
func loseCommit() bool {
	return testbugs.On(testbugs.AckBeforeCommit) && batches.Add(1)%4 == 0
}
