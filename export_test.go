package cluster

// Hooks for the external tests (package cluster_test).

// MonoAfter is monoAfter, the saturating sum behind every deadline on the
// monotonic clock.
var MonoAfter = monoAfter

// ResolveConfig returns c with its defaults applied, as New uses it.
func ResolveConfig(c Config) (Config, error) { return c.resolve() }
