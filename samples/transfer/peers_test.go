package transfer_test

import (
	"context"
	"errors"
	"time"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/samples/transfer"
)

// The two peers the port is measured against, written the way samples-go writes the
// saga: each compensation deferred once its step succeeded, every activity (the
// compensations too) under the same options, three attempts of a minute.
//
//   - plain is the sample as it is: the bank is called without an idempotency key.
//   - careful is what a careful user of plain Temporal writes: the transfer's
//     ReferenceID, with the movement's kind, as the bank's idempotency key.
const (
	plain   = "plain"
	careful = "careful"
)

func peerWorkflow(peer string) func(ctx workflow.Context, d transfer.TransferDetails) error {
	return func(ctx workflow.Context, d transfer.TransferDetails) (err error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Minute,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2.0,
				MaximumInterval: time.Minute, MaximumAttempts: 3},
		})
		if err = workflow.ExecuteActivity(ctx, peer+".Withdraw", d).Get(ctx, nil); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, workflow.ExecuteActivity(ctx, peer+".WithdrawCompensation", d).Get(ctx, nil))
			}
		}()
		if err = workflow.ExecuteActivity(ctx, peer+".Deposit", d).Get(ctx, nil); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, workflow.ExecuteActivity(ctx, peer+".DepositCompensation", d).Get(ctx, nil))
			}
		}()
		return workflow.ExecuteActivity(ctx, peer+".StepWithError", d).Get(ctx, nil)
	}
}

// peerActivities moves money at the bank as the peer does.
type peerActivities struct {
	bank  *transfer.Bank
	keyed bool
}

func (p peerActivities) move(ctx context.Context, d transfer.TransferDetails, account string, amount float32, kind string) error {
	key := ""
	if p.keyed {
		key = d.ReferenceID + "-" + kind
	}
	_, err := p.bank.Move(ctx, transfer.Movement{IdempotencyKey: key, Account: account, Amount: amount, Reference: d.ReferenceID, Kind: kind})
	return err
}

func (p peerActivities) Withdraw(ctx context.Context, d transfer.TransferDetails) error {
	return p.move(ctx, d, d.FromAccount, -d.Amount, "withdraw")
}

func (p peerActivities) WithdrawCompensation(ctx context.Context, d transfer.TransferDetails) error {
	return p.move(ctx, d, d.FromAccount, d.Amount, "withdraw-compensation")
}

func (p peerActivities) Deposit(ctx context.Context, d transfer.TransferDetails) error {
	return p.move(ctx, d, d.ToAccount, d.Amount, "deposit")
}

func (p peerActivities) DepositCompensation(ctx context.Context, d transfer.TransferDetails) error {
	return p.move(ctx, d, d.ToAccount, -d.Amount, "deposit-compensation")
}

// registry is a Temporal worker or test environment.
type registry interface {
	RegisterWorkflow(w any)
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
	RegisterActivity(a any)
	RegisterActivityWithOptions(a any, options tactivity.RegisterOptions)
}

// registerAll registers the port as its worker main does, and both peers beside it.
func registerAll(r registry, bank *transfer.Bank) {
	r.RegisterWorkflow(transfer.TransferMoney)
	r.RegisterActivity(transfer.Withdraw)
	r.RegisterActivity(transfer.WithdrawCompensation)
	r.RegisterActivity(transfer.Deposit)
	r.RegisterActivity(transfer.DepositCompensation)
	r.RegisterActivity(transfer.StepWithError)
	for _, peer := range []string{plain, careful} {
		a := peerActivities{bank: bank, keyed: peer == careful}
		r.RegisterWorkflowWithOptions(peerWorkflow(peer), workflow.RegisterOptions{Name: peer + ".TransferMoney"})
		for name, fn := range map[string]any{
			"Withdraw": a.Withdraw, "WithdrawCompensation": a.WithdrawCompensation, "Deposit": a.Deposit,
			"DepositCompensation": a.DepositCompensation, "StepWithError": transfer.StepWithError,
		} {
			r.RegisterActivityWithOptions(fn, tactivity.RegisterOptions{Name: peer + "." + name})
		}
	}
}

// workflowOf is the workflow each version is started as.
func workflowOf(version string) string {
	if version == oncekit {
		return "TransferMoney"
	}
	return version + ".TransferMoney"
}

const oncekit = "oncekit"

var versions = []string{plain, careful, oncekit}
