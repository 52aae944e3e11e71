// Package systemtest holds the tests of the whole write path at once, on
// one node assembled by testkit/testrig against the real servers: the
// model-based test (seeded random operations of every kind, compared after
// each step with a plain reference model), the adversarial scenarios (Redis
// older, failing mid-cart, keys lost twice, races of payments and
// releases), and the properties no single room owns (names exact in every
// store, exactly once after retention). Each room's own tests live beside
// it; these are what only the assembly can show.
package systemtest
