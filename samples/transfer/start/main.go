// Command start starts a money transfer and waits for how it ends. Run it twice with the
// same -ref to see the second workflow return the first one's outcome.
package main

import (
	"context"
	"flag"
	"log"

	"github.com/google/uuid"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/samples/transfer"
)

func main() {
	ref := flag.String("ref", uuid.NewString(), "the transfer's reference ID, which keys its saga")
	flag.Parse()
	c, err := client.Dial(client.Options{})
	if err != nil {
		log.Fatalln("cannot dial Temporal:", err)
	}
	defer c.Close()
	options := client.StartWorkflowOptions{
		ID:        "transfer-money-workflow",
		TaskQueue: transfer.TransferMoneyTaskQueue,
	}
	transferDetails := transfer.TransferDetails{
		Amount:      54.99,
		FromAccount: "001-001",
		ToAccount:   "002-002",
		ReferenceID: *ref,
	}
	we, err := c.ExecuteWorkflow(context.Background(), options, transfer.TransferMoney, transferDetails)
	if err != nil {
		log.Fatalln("cannot start the transfer:", err)
	}
	log.Printf("transfer of $%.2f from %s to %s started: reference %s, workflow %s, run %s",
		transferDetails.Amount, transferDetails.FromAccount, transferDetails.ToAccount,
		transferDetails.ReferenceID, we.GetID(), we.GetRunID())
	// The sample's last step fails, so the transfer ends compensated.
	if err := we.Get(context.Background(), nil); err != nil {
		log.Printf("transfer %s ended: %v", transferDetails.ReferenceID, err)
		return
	}
	log.Printf("transfer %s completed", transferDetails.ReferenceID)
}
