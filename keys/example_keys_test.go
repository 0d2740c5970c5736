package keys_test

import (
	"fmt"

	"github.com/oncekit/oncekit/keys"
)

// A business key names the intent itself, so it survives workflow resets and new runs.
func ExampleBusiness() {
	k, err := keys.Business("order-42", "charge")
	if err != nil {
		panic(err)
	}
	fmt.Println(k)
	// Output: v1:biz:order-42:charge
}

// Derive the key a compensation runs under, and the key sent to a payment provider.
// The same parent always gives the same children.
func ExampleDerive() {
	charge := keys.Run("0b7f8c1e-3d2a-4f6b-9a51-2c8e7d4b1f00", "5")
	refund, _ := keys.Derive(charge, "refund")
	providerKey, _ := keys.Derive(charge, "stripe-charge")
	fmt.Println(charge)
	fmt.Println(refund)
	fmt.Println(providerKey)
	// Output:
	// v1:run:0b7f8c1e-3d2a-4f6b-9a51-2c8e7d4b1f00:5
	// refund.153bdd46b5b8f0d5f69f128ef8c365ed
	// stripe-charge.f956152bebcfc802383fa8e99d738d88
}

// Fingerprints ignore field order, white space and number formatting.
func ExampleFingerprintJSON() {
	a, _ := keys.FingerprintJSON(map[string]any{"amount": 100, "currency": "EUR"})
	b, _ := keys.FingerprintJSON([]byte(`{ "currency": "EUR", "amount": 1.00e2 }`))
	c, _ := keys.FingerprintJSON(map[string]any{"amount": 101, "currency": "EUR"})
	fmt.Println(a == b, a == c)
	// Output: true false
}
