// Command payment is oncekit's demo: a checkout saga (reserve inventory, charge a card
// through a payment provider, ship; release and refund on failure) run for a few hundred
// orders while its worker is SIGKILLed after charges, provider answers are lost, shipments
// fail and orders are submitted twice. The same orders and faults go through a naive
// saga in the same run. It ends with a table of charges, refunds and duplicates, and
// exits non-zero if oncekit's saga produced a single duplicate or lost a cent.
//
//	go run -C samples ./payment
//
// It starts a throwaway PostgreSQL and a Temporal dev server unless DATABASE_URL and
// TEMPORAL_ADDRESS name servers to use.
package main
