package transfer

import (
	"context"
	"errors"
	"time"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
)

// TransferDetails is the workflow's input, as in the sample.
type TransferDetails struct {
	Amount      int64  `json:"amount"`
	FromAccount string `json:"from_account"`
	ToAccount   string `json:"to_account"`
	ReferenceID string `json:"reference_id"`
	// Reject makes the last step fail, so the saga compensates.
	Reject bool `json:"reject,omitempty"`
}

// Names the activities and workflows are registered under.
const (
	Withdraw             = "transfer.withdraw"
	WithdrawCompensation = "transfer.withdraw-compensation"
	Deposit              = "transfer.deposit"
	DepositCompensation  = "transfer.deposit-compensation"
	Confirm              = "transfer.confirm"
	Workflow             = "transfer"
	PlainPrefix          = "plain."
	PlainWorkflow        = PlainPrefix + Workflow
)

// ErrTypeRejected is the error type of a rejected transfer's last step.
const ErrTypeRejected = "TransferRejected"

// activityOptions are short attempts, so a lost worker's attempt is retried within
// seconds; the same for both versions.
func activityOptions(ctx workflow.Context) workflow.Context {
	retry := policy.StepRetryPolicy(ErrTypeRejected)
	retry.InitialInterval = 200 * time.Millisecond
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 3 * time.Second, RetryPolicy: retry})
}

// TransferMoney is the port: a saga keyed by the transfer's reference, so a transfer
// submitted twice moves its money once, and a compensated transfer stays compensated.
func TransferMoney(ctx workflow.Context, d TransferDetails) error {
	key, err := keys.Business("transfer", d.ReferenceID)
	if err != nil {
		return err
	}
	co := saga.CompensationOptionsDefault()
	co.StartToCloseTimeout = 3 * time.Second
	co.RetryPolicy.InitialInterval = 200 * time.Millisecond
	return saga.RunErr(ctx, &saga.Opts{Key: key, Request: d, CompensationOptions: &co}, func(ctx workflow.Context, s *saga.Saga) error {
		ctx = activityOptions(ctx)
		for _, st := range []saga.Step{
			{Name: "withdraw", Activity: Withdraw, Args: []any{d}, Compensation: WithdrawCompensation},
			{Name: "deposit", Activity: Deposit, Args: []any{d}, Compensation: DepositCompensation},
			{Name: "confirm", Activity: Confirm, Args: []any{d}},
		} {
			if err := s.Do(ctx, st, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// TransferMoneyPlain is the saga as the sample writes it: plain activities, each
// compensation deferred once its step succeeded.
func TransferMoneyPlain(ctx workflow.Context, d TransferDetails) (err error) {
	ctx = activityOptions(ctx)
	if err = workflow.ExecuteActivity(ctx, PlainPrefix+Withdraw, d).Get(ctx, nil); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, workflow.ExecuteActivity(ctx, PlainPrefix+WithdrawCompensation, d).Get(ctx, nil))
		}
	}()
	if err = workflow.ExecuteActivity(ctx, PlainPrefix+Deposit, d).Get(ctx, nil); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, workflow.ExecuteActivity(ctx, PlainPrefix+DepositCompensation, d).Get(ctx, nil))
		}
	}()
	return workflow.ExecuteActivity(ctx, PlainPrefix+Confirm, d).Get(ctx, nil)
}

// Activities call the bank. AfterMove, when set, runs after each movement the bank made
// and before the activity returns: the crash tests stop a worker there.
type Activities struct {
	Bank      *Bank
	AfterMove func(ctx context.Context, activity string)
}

func (a *Activities) move(ctx context.Context, name, key, account string, amount int64, ref string) error {
	if _, err := a.Bank.Move(ctx, key, account, amount, ref); err != nil {
		return err
	}
	if a.AfterMove != nil {
		a.AfterMove(ctx, name)
	}
	return nil
}

// Withdraw takes the amount from the source account, under the step's downstream key.
func (a *Activities) Withdraw(ctx context.Context, d TransferDetails) error {
	return activity.ExternalErr(ctx, d, func(ctx context.Context, call activity.Call, d TransferDetails) error {
		return a.move(ctx, Withdraw, string(call.DownstreamKey), d.FromAccount, -d.Amount, d.ReferenceID)
	}, nil)
}

// Deposit puts the amount into the target account.
func (a *Activities) Deposit(ctx context.Context, d TransferDetails) error {
	return activity.ExternalErr(ctx, d, func(ctx context.Context, call activity.Call, d TransferDetails) error {
		return a.move(ctx, Deposit, string(call.DownstreamKey), d.ToAccount, d.Amount, d.ReferenceID)
	}, nil)
}

// WithdrawCompensation returns the amount to the source account, if it was taken.
func (a *Activities) WithdrawCompensation(ctx context.Context, d TransferDetails) error {
	return a.undo(ctx, WithdrawCompensation, d, d.FromAccount, -d.Amount)
}

// DepositCompensation takes the amount back from the target account, if it arrived.
func (a *Activities) DepositCompensation(ctx context.Context, d TransferDetails) error {
	return a.undo(ctx, DepositCompensation, d, d.ToAccount, d.Amount)
}

// undo reverses the step's movement of amount on account. A step that never moved
// money, or failed definitively, has nothing to undo. A step that claimed its key and
// did not finish may or may not have moved: the movement is settled first by repeating
// it under the step's own downstream key (the bank moves nothing if it happened), then
// reversed.
func (a *Activities) undo(ctx context.Context, name string, d TransferDetails, account string, amount int64) error {
	step, err := activity.StepResult(ctx, nil, nil)
	if err != nil {
		return err
	}
	switch step.State {
	case activity.StepNotRun, activity.StepFailed:
		return nil
	case activity.StepPending:
		if _, err := a.Bank.Move(ctx, string(step.DownstreamKey), account, amount, d.ReferenceID); err != nil {
			return err
		}
	}
	return activity.ExternalErr(ctx, d, func(ctx context.Context, call activity.Call, d TransferDetails) error {
		return a.move(ctx, name, string(call.DownstreamKey), account, -amount, d.ReferenceID)
	}, nil)
}

// Confirm is the last step; it fails for a rejected transfer.
func (a *Activities) Confirm(_ context.Context, d TransferDetails) error {
	if d.Reject {
		return temporal.NewNonRetryableApplicationError("the transfer was rejected", ErrTypeRejected, nil)
	}
	return nil
}

// PlainActivities are the sample's activities: each call moves money, keyless.
type PlainActivities struct{ *Activities }

func (a PlainActivities) Withdraw(ctx context.Context, d TransferDetails) error {
	return a.move(ctx, PlainPrefix+Withdraw, "", d.FromAccount, -d.Amount, d.ReferenceID)
}

func (a PlainActivities) Deposit(ctx context.Context, d TransferDetails) error {
	return a.move(ctx, PlainPrefix+Deposit, "", d.ToAccount, d.Amount, d.ReferenceID)
}

func (a PlainActivities) WithdrawCompensation(ctx context.Context, d TransferDetails) error {
	return a.move(ctx, PlainPrefix+WithdrawCompensation, "", d.FromAccount, d.Amount, d.ReferenceID)
}

func (a PlainActivities) DepositCompensation(ctx context.Context, d TransferDetails) error {
	return a.move(ctx, PlainPrefix+DepositCompensation, "", d.ToAccount, -d.Amount, d.ReferenceID)
}

// Registry is where the transfer registers: a Temporal worker or test environment.
type Registry interface {
	RegisterWorkflowWithOptions(fn any, opts workflow.RegisterOptions)
	RegisterActivityWithOptions(fn any, opts tactivity.RegisterOptions)
}

// Register registers both versions' workflows and activities on r.
func Register(r Registry, a *Activities) {
	r.RegisterWorkflowWithOptions(TransferMoney, workflow.RegisterOptions{Name: Workflow})
	r.RegisterWorkflowWithOptions(TransferMoneyPlain, workflow.RegisterOptions{Name: PlainWorkflow})
	p := PlainActivities{a}
	for name, fn := range map[string]any{
		Withdraw: a.Withdraw, WithdrawCompensation: a.WithdrawCompensation, Deposit: a.Deposit,
		DepositCompensation: a.DepositCompensation, Confirm: a.Confirm,
		PlainPrefix + Withdraw: p.Withdraw, PlainPrefix + WithdrawCompensation: p.WithdrawCompensation,
		PlainPrefix + Deposit: p.Deposit, PlainPrefix + DepositCompensation: p.DepositCompensation,
		PlainPrefix + Confirm: a.Confirm,
	} {
		r.RegisterActivityWithOptions(fn, tactivity.RegisterOptions{Name: name})
	}
}
