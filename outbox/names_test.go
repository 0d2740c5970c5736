package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/outbox"
)

// The values the documentation states and the dashboards and alerts filter on: changing
// one breaks users, so it goes in the CHANGELOG, and this test says so first.
func TestDocumentedValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		got, want any
	}{
		{outbox.SchemaDefault, "oncekit"},
		{outbox.MigrationLine, "outbox"},
		{outbox.InstrumentationName, "github.com/oncekit/oncekit/outbox"},
		{outbox.AttrTopic, "oncekit.topic"},
		{outbox.AttrEventID, "oncekit.event_id"},
		{outbox.BatchSizeDefault, 500},
		{outbox.PollIntervalDefault, time.Second},
		{outbox.BackoffMinDefault, time.Second},
		{outbox.BackoffMaxDefault, 5 * time.Minute},
		{outbox.PublishTimeoutDefault, 10 * time.Second},
		// Over twice the default PublishTimeout, so a publication never outlives its lease.
		{outbox.LeaseDefault, 30 * time.Second},
		{outbox.AcquireTimeoutDefault, 10 * time.Second},
		{outbox.StopGraceDefault, 5 * time.Second},
		{outbox.DeadLimitDefault, 100},
		{outbox.MaxRetryDead, 10000},
	} {
		require.Equal(t, c.want, c.got)
	}
	require.Greater(t, outbox.LeaseDefault, 2*outbox.PublishTimeoutDefault)
}
