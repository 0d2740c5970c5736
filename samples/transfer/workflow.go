package transfer

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/saga"
)

// TransferMoney withdraws, deposits, and runs the step that fails, compensating each
// movement of money when a later step fails. The saga is keyed by the transfer's
// ReferenceID: a second workflow for the same transfer returns how the first one ended
// and moves no money.
func TransferMoney(ctx workflow.Context, transferDetails TransferDetails) error {
	retryPolicy := &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2.0,
		MaximumInterval:    time.Minute,
		MaximumAttempts:    3,
	}
	options := workflow.ActivityOptions{
		// A minute per attempt; a worker lost during an attempt is noticed after it.
		StartToCloseTimeout: time.Minute,
		// Three attempts per step, then the saga compensates. Compensations keep the
		// saga's own options instead: unlimited attempts for up to a day.
		RetryPolicy: retryPolicy,
	}
	ctx = workflow.WithActivityOptions(ctx, options)

	key, err := keys.Business("transfer", transferDetails.ReferenceID)
	if err != nil {
		return err
	}
	return saga.RunErr(ctx, &saga.Opts{Key: key, Request: transferDetails}, func(ctx workflow.Context, s *saga.Saga) error {
		err := s.Do(ctx, saga.Step{Name: "withdraw", Activity: Withdraw, Args: []any{transferDetails},
			Compensation: WithdrawCompensation}, nil)
		if err != nil {
			return err // saga.RunErr runs the compensations registered so far, in reverse order
		}
		err = s.Do(ctx, saga.Step{Name: "deposit", Activity: Deposit, Args: []any{transferDetails},
			Compensation: DepositCompensation}, nil)
		if err != nil {
			return err
		}
		return s.Do(ctx, saga.Step{Name: "step-with-error", Activity: StepWithError, Args: []any{transferDetails}}, nil)
	})
}
