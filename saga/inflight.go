package saga

import (
	"sync"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
)

// inFlight counts, for each workflow instance (named by its *workflow.Info, which the
// SDK keeps for the instance's lifetime and a replay after eviction replaces), the runs
// of each saga key in flight in it. Two runs of one workflow present the same token, so
// the ledger cannot tell them apart: this registry makes the second wait for the first.
// The coroutines of one instance run one at a time; the mutex guards the map across
// instances, which run on different goroutines.
var inFlight = struct {
	sync.Mutex
	m map[*workflow.Info]map[keys.Key]int
}{m: map[*workflow.Info]map[keys.Key]int{}}

// The version of the wait for another run of the same key in the same workflow, asked
// only when there is one, so that a history written before replays as it ran.
const (
	versionInFlightChange = "oncekit.saga.in-flight"
	versionInFlight       = 1
)

// heldKey marks, in the context Run hands the saga's function, the key of that saga.
type heldKey keys.Key

// enter waits until no other run of this workflow is in flight with the saga's key, then
// counts this one in; leave counts it out. A run nested in the saga of its own key would
// wait for itself, so it is refused instead.
func (s *Saga) enter(ctx workflow.Context) (leave func(), err error) {
	if ctx.Value(heldKey(s.key)) != nil {
		return nil, temporal.NewNonRetryableApplicationError("oncekit/saga: saga.Run with the key "+string(s.key)+
			" was called inside the saga of the same key, which would wait for itself: give the inner saga a key of its own",
			policy.ErrTypeInvalid, nil)
	}
	info := workflow.GetInfo(ctx)
	busy := func() bool {
		inFlight.Lock()
		defer inFlight.Unlock()
		return inFlight.m[info][s.key] > 0
	}
	if busy() && workflow.GetVersion(ctx, versionInFlightChange, workflow.DefaultVersion, versionInFlight) >= versionInFlight {
		if err := workflow.Await(ctx, func() bool { return !busy() }); err != nil {
			return nil, err
		}
	}
	inFlight.Lock()
	if inFlight.m[info] == nil {
		inFlight.m[info] = map[keys.Key]int{}
	}
	inFlight.m[info][s.key]++
	inFlight.Unlock()
	return func() {
		inFlight.Lock()
		defer inFlight.Unlock()
		if inFlight.m[info][s.key]--; inFlight.m[info][s.key] <= 0 {
			delete(inFlight.m[info], s.key)
		}
		if len(inFlight.m[info]) == 0 {
			delete(inFlight.m, info)
		}
	}, nil
}
