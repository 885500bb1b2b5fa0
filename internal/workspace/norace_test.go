//go:build !race

package workspace_test

var raceFlag []string
