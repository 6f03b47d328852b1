//go:build !unix

package cluster_test

// The multi-process tests stop and kill node processes with Unix signals;
// elsewhere this binary never runs as a child.
const envChild = "CLUSTER_TEST_CHILD"

func childMain() int { return 2 }
