package activity

import (
	"context"
	"errors"

	tactivity "go.temporal.io/sdk/activity"

	"github.com/oncekit/oncekit/keys"
)

// ErrNotActivity is returned when a context is not a Temporal activity's context.
var ErrNotActivity = errors.New("oncekit/activity: context is not a Temporal activity context: call this inside an activity, or build the key with keys.Run, keys.Workflow or keys.Business")

// IdentityOf reads the identity of the activity running under ctx. Outside an
// activity it returns [ErrNotActivity].
func IdentityOf(ctx context.Context) (keys.Identity, error) {
	if !tactivity.IsActivity(ctx) {
		return keys.Identity{}, ErrNotActivity
	}
	info := tactivity.GetInfo(ctx)
	return keys.Identity{
		WorkflowID:    info.WorkflowExecution.ID,
		RunID:         info.WorkflowExecution.RunID,
		ActivityID:    info.ActivityID,
		ActivityRunID: info.ActivityRunID,
		Local:         info.IsLocalActivity,
	}, nil
}

// KeyFor returns the key of the activity running under ctx by strategy s (see
// [keys.Identity.Key]); the zero Strategy is keys.RunScoped. Outside an activity it
// returns [ErrNotActivity]; for keys.BusinessScoped, which no identity can make, the
// error of keys.Identity.Key.
func KeyFor(ctx context.Context, s keys.Strategy) (keys.Key, error) {
	id, err := IdentityOf(ctx)
	if err != nil {
		return "", err
	}
	return id.Key(s)
}
