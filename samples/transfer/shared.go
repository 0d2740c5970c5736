package transfer

// TransferMoneyTaskQueue is the task queue the worker polls and the starter starts
// transfers on.
const TransferMoneyTaskQueue = "TRANSFER_MONEY_TASK_QUEUE"

// TransferDetails is a transfer: the workflow's input, handed to every activity.
type TransferDetails struct {
	Amount      float32
	FromAccount string
	ToAccount   string
	ReferenceID string
}
