package transfer

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	ttestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
)

// The samples-go unit test, every activity mocked, on Temporal's own test environment.
// One line makes it test the workflow: the saga's records kept in memory.
func Test_Workflow(t *testing.T) {
	t.Parallel()
	testSuite := &ttestsuite.WorkflowTestSuite{}
	env := testSuite.NewTestWorkflowEnvironment()
	testsuite.RegisterSagaInMemory(env)
	// A workflow task may take 10 s, not the SDK's 1 s, before the environment calls it a
	// deadlock: the tests run under the race detector, beside others, on two cores.
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: 10 * time.Second})
	testDetails := TransferDetails{
		Amount:      1.00,
		FromAccount: "001-001",
		ToAccount:   "002-002",
		ReferenceID: "1234",
	}
	env.OnActivity(Withdraw, mock.Anything, testDetails).Return(nil)
	env.OnActivity(WithdrawCompensation, mock.Anything, testDetails).Return(nil)
	env.OnActivity(Deposit, mock.Anything, testDetails).Return(nil)
	env.OnActivity(DepositCompensation, mock.Anything, testDetails).Return(nil)
	env.OnActivity(StepWithError, mock.Anything, testDetails).Return(errors.New("some error"))
	env.ExecuteWorkflow(TransferMoney, testDetails)
	require.True(t, env.IsWorkflowCompleted())
	var app *temporal.ApplicationError
	require.ErrorAs(t, env.GetWorkflowError(), &app)
	require.Equal(t, policy.ErrTypeCompensated, app.Type())
	env.AssertExpectations(t) // every step ran, and both compensations
}

// The trap the line above avoids: without the saga's records the workflow fails before
// any mock is called, and a test that only asserts an error passes all the same. The
// error says what is missing.
func Test_WorkflowWithoutRecordsCallsNoMock(t *testing.T) {
	t.Parallel()
	testSuite := &ttestsuite.WorkflowTestSuite{}
	env := testSuite.NewTestWorkflowEnvironment()
	// A workflow task may take 10 s, not the SDK's 1 s, before the environment calls it a
	// deadlock: the tests run under the race detector, beside others, on two cores.
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: 10 * time.Second})
	testDetails := TransferDetails{Amount: 1.00, FromAccount: "001-001", ToAccount: "002-002", ReferenceID: "1234"}
	env.OnActivity(Withdraw, mock.Anything, testDetails).Return(nil)
	env.ExecuteWorkflow(TransferMoney, testDetails)
	require.ErrorContains(t, env.GetWorkflowError(), "testsuite.RegisterSagaInMemory")
	env.AssertNotCalled(t, "Withdraw", mock.Anything, testDetails)
}
