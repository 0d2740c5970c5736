package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/migrate"
)

const (
	commandModule = "github.com/oncekit/oncekit/cmd/oncekit"
	libraryModule = "github.com/oncekit/oncekit"
)

// moduleVersions are the versions of the command's and the library's modules, as the Go
// build recorded them: a tag, a pseudo-version, or "devel" for a work tree's build.
func moduleVersions() (command, library string) {
	command, library = "devel", "devel"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return command, library
	}
	clean := func(v string) string {
		if v == "" || v == "(devel)" {
			return "devel"
		}
		return v
	}
	if info.Main.Path == commandModule {
		command = clean(info.Main.Version)
	}
	for _, d := range info.Deps {
		if d.Path == libraryModule {
			library = clean(d.Version)
			if d.Replace != nil {
				library = "devel (" + d.Replace.Path + ")"
			}
		}
	}
	return command, library
}

func commandVersion() string {
	c, _ := moduleVersions()
	return c
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use: "version",
		Example: `  oncekit version
  oncekit version --json`,
		Short: "Print the command's and the library's versions, and the migrations this build knows",
		Args:  args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error {
			command, library := moduleVersions()
			known := map[string]int{}
			ms, err := migrate.Known()
			if err != nil {
				return err
			}
			for _, m := range ms {
				known[m.Line] = max(known[m.Line], m.Version)
			}
			v := map[string]any{"oncekit": command, "library": library, "go": runtime.Version(), "migrations": known}
			return a.emit(v, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "oncekit\t%s\nlibrary\t%s\ngo\t%s\n", command, library, runtime.Version())
				fmt.Fprintf(w, "migrations\tledger %d, webhook %d, inbox %d, outbox %d\n", known["ledger"], known["webhook"], known["inbox"], known["outbox"])
			})
		}),
	}
}
