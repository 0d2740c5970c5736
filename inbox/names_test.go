package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
)

// The values the documentation states and the dashboards and alerts filter on: changing
// one breaks users, so it goes in the CHANGELOG, and this test says so first.
func TestDocumentedValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		got, want any
	}{
		{inbox.SchemaDefault, "oncekit"},
		{inbox.MigrationLine, "inbox"},
		{inbox.InstrumentationName, "github.com/oncekit/oncekit/inbox"},
		{inbox.AttrSubscriber, "oncekit.subscriber"},
	} {
		require.Equal(t, c.want, c.got)
	}
}
