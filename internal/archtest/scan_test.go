package archtest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The readers the documentation checks rest on find what a reader of the text sees.
func TestDocReaders(t *testing.T) {
	t.Parallel()

	t.Run("Mentions", func(t *testing.T) {
		t.Parallel()
		show := func(s string) []string {
			var out []string
			for _, mn := range scanMentions(s, true) {
				w := mn.pkg + "|" + strings.Join(mn.names, ".")
				if mn.call {
					w += "()"
				}
				if mn.single {
					w += "=1"
				}
				if mn.prefix {
					w += "*"
				}
				out = append(out, w)
			}
			return out
		}
		require.Equal(t, []string{"ledger|DoOpts.Mode"}, show("set ledger.DoOpts.Mode."))
		require.Equal(t, []string{"ledger|Ledger.Do"}, show("(*ledger.Ledger).Do"))
		require.Equal(t, []string{"|DoOpts.Mode", "|DoTx"}, show("DoOpts.Mode, then DoTx"))
		require.Equal(t, []string{"|Opts.Key", "keys|Business()=1"}, show(`Opts.Key = keys.Business(id, "charge")`))
		require.Equal(t, []string{"ledger|New()"}, show("l, err := ledger.New(pool, nil)"))
		require.Equal(t, []string{"idempotency|Problem*"}, show("idempotency.Problem*"))
		require.Empty(t, show("oncekit.ledger.calls, go.temporal.io/sdk/worker.New, https://pkg.go.dev/x.Y, [ledger.Do], e.g. call.downstream"))
	})

	t.Run("Markdown", func(t *testing.T) {
		t.Parallel()
		md := parseMarkdown("# The `oncekit` command\n" +
			"\n" +
			"Run `activity.DoErr(ctx,\n" +
			"req)` and ``a ` b``, see [the demo](#the-oncekit-command) and [x](docs/x.md).\n" +
			"\n" +
			"```go\n" +
			"ledger.Gone()\n" +
			"```\n" +
			"\n" +
			"```\n" +
			"$ make demo\n" +
			"oncekit saga: output\n" +
			"```\n" +
			"\n" +
			"```\n" +
			"make test   # a listing, no prompts\n" +
			"```\n")
		require.Equal(t, []located{{1, "oncekit"}, {3, "activity.DoErr(ctx, req)"}, {4, "a ` b"}}, md.spans)
		require.Equal(t, []located{{11, "make demo"}, {16, "make test   # a listing, no prompts"}}, md.commands)
		require.Equal(t, []located{{4, "#the-oncekit-command"}, {4, "docs/x.md"}}, md.links)
		require.True(t, md.anchors["the-oncekit-command"])
	})
}
