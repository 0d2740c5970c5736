// Command temporal-cli builds the Temporal CLI that runs the dev server into oncekit's
// cache, printing progress, and prints its path. It does nothing when TEMPORAL_ADDRESS
// names a server to use instead.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/oncekit/oncekit/internal/devserver"
)

func main() {
	if addr := os.Getenv("TEMPORAL_ADDRESS"); addr != "" {
		fmt.Fprintf(os.Stderr, "temporal-cli: TEMPORAL_ADDRESS=%s is set; the dev server is not needed\n", addr)
		return
	}
	path, err := devserver.EnsureCLI(context.Background(), os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(path)
}
