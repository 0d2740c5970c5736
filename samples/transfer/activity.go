package transfer

import (
	"context"
	"errors"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
)

// Withdraw takes the amount from the source account. The bank gets the step's downstream
// key as its idempotency key: a retry after the worker died moves nothing a second time.
func Withdraw(ctx context.Context, transferDetails TransferDetails) error {
	return activity.ExternalErr(ctx, transferDetails, func(ctx context.Context, call activity.Call, d TransferDetails) error {
		return move(ctx, call.DownstreamKey, d.FromAccount, -d.Amount, d, "withdraw")
	}, nil)
}

// WithdrawCompensation puts the amount back into the source account, if it was taken.
func WithdrawCompensation(ctx context.Context, transferDetails TransferDetails) error {
	d := transferDetails
	return undo(ctx, d.FromAccount, -d.Amount, d, "withdraw")
}

// Deposit puts the amount into the target account.
func Deposit(ctx context.Context, transferDetails TransferDetails) error {
	return activity.ExternalErr(ctx, transferDetails, func(ctx context.Context, call activity.Call, d TransferDetails) error {
		return move(ctx, call.DownstreamKey, d.ToAccount, d.Amount, d, "deposit")
	}, nil)
}

// DepositCompensation takes the amount back out of the target account, if it arrived.
func DepositCompensation(ctx context.Context, transferDetails TransferDetails) error {
	d := transferDetails
	return undo(ctx, d.ToAccount, d.Amount, d, "deposit")
}

// StepWithError is the step that fails, so that the transfer compensates: the bank
// refuses the transfer (every transfer, unless Bank.RefuseFunc says otherwise).
func StepWithError(ctx context.Context, transferDetails TransferDetails) error {
	b, err := theBank()
	if err != nil {
		return err
	}
	if b.RefuseFunc == nil || b.RefuseFunc(transferDetails) {
		return errors.New("some error")
	}
	return nil
}

func move(ctx context.Context, key keys.Key, account string, amount float32, d TransferDetails, kind string) error {
	b, err := theBank()
	if err != nil {
		return err
	}
	_, err = b.Move(ctx, Movement{IdempotencyKey: string(key), Account: account, Amount: amount, Reference: d.ReferenceID, Kind: kind})
	return err
}

// undo reverses the movement of amount on account made by the step it compensates. A
// step that never moved money, or failed definitively, has nothing to undo. A step that
// claimed its key and did not finish may or may not have moved it: the movement is
// settled first, by repeating it under the step's own downstream key (the bank moves
// nothing if it happened), then reversed.
func undo(ctx context.Context, account string, amount float32, d TransferDetails, kind string) error {
	step, err := activity.StepResult(ctx, nil, nil)
	if err != nil {
		return err
	}
	switch step.State {
	case activity.StepNotRun, activity.StepFailed:
		return nil
	case activity.StepPending:
		if err := move(ctx, step.DownstreamKey, account, amount, d, kind); err != nil {
			return err
		}
	}
	return activity.ExternalErr(ctx, d, func(ctx context.Context, call activity.Call, d TransferDetails) error {
		return move(ctx, call.DownstreamKey, account, -amount, d, kind+"-compensation")
	}, nil)
}
