package lock

// The one-node jobs' locks, one key each for the whole fleet (see
// stock/keys.go for every other key the service writes):
//
//	inv:{timeouts}:sweeplock   string  the timeout sweep's one-node lock
//	inv:{relay}:lock           string  the outbox relay's leader lock
//	inv:{realign}:lock         string  the periodic realign's one-node lock
//	inv:{retention}:lock       string  the retention job's one-node lock
//	inv:{events}:lock          string  the events job's leader lock
//	inv:{projector}:lock       string  the lean sale's projector's leader lock
//	inv:{webhook:ID}:lock      string  the delivery lock of webhook subscription ID
const (
	// SweepKey may stay one key for the whole fleet: each node tries it
	// once per sweep interval, and no order touches it.
	SweepKey     = "inv:{timeouts}:sweeplock"
	RelayKey     = "inv:{relay}:lock"
	RealignKey   = "inv:{realign}:lock"
	RetentionKey = "inv:{retention}:lock"
	EventsKey    = "inv:{events}:lock"
	ProjectorKey = "inv:{projector}:lock"
)

// WebhookKey is the lock under which one node at a time delivers the
// events of webhook subscription id (ids are [A-Za-z0-9._-]: no brace
// breaks the hash tag).
func WebhookKey(id string) string { return "inv:{webhook:" + id + "}:lock" }
