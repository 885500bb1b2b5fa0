package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/migrate"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the pgoutbox version, its build, the newest migration of each line and the compatibility window",
		RunE: func(cmd *cobra.Command, _ []string) error {
			version, revision := "(devel)", ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				if bi.Main.Version != "" {
					version = bi.Main.Version
				}
				for _, s := range bi.Settings {
					switch s.Key {
					case "vcs.revision":
						revision = s.Value
					case "vcs.modified":
						if s.Value == "true" {
							revision += "+dirty"
						}
					}
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "pgoutbox %s\n", version)
			if revision != "" {
				fmt.Fprintf(out, "revision %s\n", revision)
			}
			fmt.Fprintf(out, "go       %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
			all, err := migrate.All()
			if err != nil {
				return err
			}
			newest := map[migrate.Line]int{}
			for _, m := range all {
				newest[m.Line] = max(newest[m.Line], m.Version)
			}
			for _, l := range migrate.Lines {
				fmt.Fprintf(out, "schema   %s v%d\n", l, newest[l])
			}
			// The compatibility window: older binaries that know these versions
			// keep running against a schema this one migrated.
			fmt.Fprintf(out, "window   %s\n", migrate.WindowString())
			return nil
		},
	}
}
