//go:build race

package workspace_test

// raceFlag is passed to the modules' go test: the race detector is on for them
// when it is on for this test.
var raceFlag = []string{"-race"}
