package testsuite

import (
	"context"
	"sync"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/internal/sagarec"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
)

// RegisterSagaInMemory registers on r stand-ins for the activities package saga records
// sagas with, which keep the records in memory, for as long as r lives. It is the one
// line that makes a unit test on Temporal's own test environment, with mocked activities,
// run the saga's steps:
//
//	env := s.NewTestWorkflowEnvironment()
//	testsuite.RegisterSagaInMemory(env)
//	env.OnActivity(Withdraw, mock.Anything, details).Return(nil)
//
// Without it such a workflow fails at once with [policy.ErrTypePluginMissing], before any
// mock is called, and a test that only asserts an error passes without testing anything:
// assert the mocks were called (env.AssertExpectations). The records behave as the
// ledger's do for one worker: a second workflow with the same saga key replays the
// first one's outcome; leases never run out. [NewWorkflowEnvironment] wires the real
// records on a ledger instead.
func RegisterSagaInMemory(r activity.Registry) {
	m := &sagaRecords{recs: map[keys.Key]*sagaRecord{}}
	r.RegisterActivityWithOptions(m.begin, tactivity.RegisterOptions{Name: sagarec.ActivityBegin})
	r.RegisterActivityWithOptions(m.hold, tactivity.RegisterOptions{Name: sagarec.ActivityHold})
	r.RegisterActivityWithOptions(m.compensating, tactivity.RegisterOptions{Name: sagarec.ActivityCompensating})
	r.RegisterActivityWithOptions(m.end, tactivity.RegisterOptions{Name: sagarec.ActivityEnd})
}

// sagaRecords are saga records in memory.
type sagaRecords struct {
	mu   sync.Mutex
	recs map[keys.Key]*sagaRecord
}

type sagaRecord struct {
	req   sagarec.BeginRequest
	ended *sagarec.Recorded
	comp  *sagarec.Compensating
}

// lookup returns the key's record, creating it for req when there is none; owned
// reports whether req's run holds it. The caller holds m.mu.
func (m *sagaRecords) lookup(req sagarec.BeginRequest) (rec *sagaRecord, owned bool, err error) {
	rec, ok := m.recs[keys.Key(req.Key)]
	if !ok {
		rec = &sagaRecord{req: req}
		m.recs[keys.Key(req.Key)] = rec
	}
	if rec.req.Fingerprint != req.Fingerprint {
		return nil, false, temporal.NewNonRetryableApplicationError("oncekit/testsuite: the saga's key "+string(req.Key)+
			" was used before for another request", policy.ErrTypeKeyReused, nil)
	}
	return rec, rec.req.Token == req.Token, nil
}

// inProgress is the answer to a run that must wait for the run holding the key.
func inProgress(ctx context.Context, req sagarec.BeginRequest) (sagarec.Recorded, error) {
	if tactivity.GetInfo(ctx).IsLocalActivity {
		return sagarec.Recorded{Held: true}, nil
	}
	return sagarec.Recorded{}, temporal.NewApplicationError("oncekit/testsuite: another run holds the saga's key "+string(req.Key), policy.ErrTypeInProgress)
}

// with answers a record call on req's key: under m.mu, an error, the ended saga's
// outcome, notOwned's answer when another run holds the key, or else fn's on the
// record.
func (m *sagaRecords) with(req sagarec.BeginRequest, notOwned func() (sagarec.Recorded, error),
	fn func(rec *sagaRecord) (sagarec.Recorded, error)) (sagarec.Recorded, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, owned, err := m.lookup(req)
	switch {
	case err != nil:
		return sagarec.Recorded{}, err
	case rec.ended != nil:
		return *rec.ended, nil
	case !owned:
		return notOwned()
	}
	return fn(rec)
}

// held answers a run that holds no key and need not wait.
func held() (sagarec.Recorded, error) { return sagarec.Recorded{Held: true}, nil }

// current answers with the record's compensation, if it has one.
func current(rec *sagaRecord) (sagarec.Recorded, error) {
	return sagarec.Recorded{Compensating: rec.comp}, nil
}

func (m *sagaRecords) begin(ctx context.Context, req sagarec.BeginRequest) (sagarec.Recorded, error) {
	return m.with(req, func() (sagarec.Recorded, error) { return inProgress(ctx, req) }, current)
}

func (m *sagaRecords) hold(_ context.Context, req sagarec.BeginRequest) (sagarec.Recorded, error) {
	return m.with(req, held, current)
}

func (m *sagaRecords) compensating(_ context.Context, req sagarec.CompensatingRequest) (sagarec.Recorded, error) {
	return m.with(req.BeginRequest, held, func(rec *sagaRecord) (sagarec.Recorded, error) {
		if rec.comp == nil {
			c := req.Compensating
			rec.comp = &c
		}
		return current(rec)
	})
}

func (m *sagaRecords) end(ctx context.Context, req sagarec.EndRequest) (sagarec.Recorded, error) {
	return m.with(req.BeginRequest, func() (sagarec.Recorded, error) { return inProgress(ctx, req.BeginRequest) },
		func(rec *sagaRecord) (sagarec.Recorded, error) {
			if req.Outcome.ErrType == "" && rec.comp != nil {
				return current(rec)
			}
			out := sagarec.Recorded{Ended: true, Result: req.Outcome.Result, ErrType: req.Outcome.ErrType, ErrMessage: req.Outcome.ErrMessage}
			if out.ErrType != "" {
				out.Compensating = rec.comp // its cause is the replayed error's
			}
			rec.ended = &out
			return out, nil
		})
}
