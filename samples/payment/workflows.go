package main

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
)

// Workflow names, as registered.
const (
	wfCheckout      = "checkout"
	wfNaiveCheckout = "checkout.naive"
)

// activityOptions are the same for both sagas: a short attempt timeout, so a lost
// worker's attempt is retried within seconds.
func activityOptions(ctx workflow.Context) workflow.Context {
	retry := policy.RetryPolicy()
	retry.InitialInterval = 200 * time.Millisecond
	retry.MaximumInterval = 2 * time.Second
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 3 * time.Second, RetryPolicy: retry})
}

// CheckoutWorkflow is the oncekit saga: reserve, charge, ship; release and refund on
// failure. The saga's key is the order ID, so a second submission of the same order
// replays the first one's outcome (or waits for it, while the first is in flight).
func CheckoutWorkflow(ctx workflow.Context, o Order) (string, error) {
	key, err := keys.Business("order", o.ID)
	if err != nil {
		return "", err
	}
	co := saga.CompensationOptionsDefault()
	co.StartToCloseTimeout = 3 * time.Second
	co.RetryPolicy.InitialInterval = 200 * time.Millisecond
	co.RetryPolicy.MaximumInterval = 2 * time.Second
	opts := &saga.Opts{Key: key, Request: o, CompensationOptions: &co}
	return saga.Run(ctx, opts, func(ctx workflow.Context, s *saga.Saga) (string, error) {
		ctx = activityOptions(ctx)
		steps := []saga.Step{
			{Name: "reserve", Activity: actReserve, Args: []any{o}, Compensation: actRelease},
			{Name: "charge", Activity: actCharge, Args: []any{o}, Compensation: actRefund},
			{Name: "ship", Activity: actShip, Args: []any{o}},
		}
		for _, st := range steps {
			if err := s.Do(ctx, st, nil); err != nil {
				return "", err // Run compensates and records the outcome
			}
		}
		return "shipped", nil
	})
}

// NaiveCheckoutWorkflow is the saga as Temporal's samples write it: plain activities
// without keys, each compensation added after its step succeeded, compensations run on
// the workflow's own context.
func NaiveCheckoutWorkflow(ctx workflow.Context, o Order) (result string, err error) {
	ctx = activityOptions(ctx)
	var compensations []string
	defer func() {
		if err != nil {
			for i := len(compensations) - 1; i >= 0; i-- {
				_ = workflow.ExecuteActivity(ctx, compensations[i], o).Get(ctx, nil)
			}
			err = temporal.NewNonRetryableApplicationError(err.Error(), policy.ErrTypeCompensated, err)
		}
	}()
	if err = workflow.ExecuteActivity(ctx, "naive."+actReserve, o).Get(ctx, nil); err != nil {
		return "", err
	}
	compensations = append(compensations, "naive."+actRelease)
	if err = workflow.ExecuteActivity(ctx, "naive."+actCharge, o).Get(ctx, nil); err != nil {
		return "", err
	}
	compensations = append(compensations, "naive."+actRefund)
	if err = workflow.ExecuteActivity(ctx, "naive."+actShip, o).Get(ctx, nil); err != nil {
		return "", err
	}
	return "shipped", nil
}
