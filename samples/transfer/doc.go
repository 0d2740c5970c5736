// Package transfer is Temporal's money-transfer saga (samples-go's "saga" sample) ported
// to oncekit: withdraw from one account, deposit into another, and a last step that can
// fail, with a compensation for each money movement. It keeps the sample's shape, a
// TransferDetails input and activities that return only an error, and shows what the
// port changes: each activity guards its call to the bank with activity.ExternalErr and
// sends the bank a downstream key, the workflow is a keyed saga.Run, and each
// compensation reads its step's record to know whether there is anything to undo.
//
// The plain version, written the way the sample writes it, sits beside the port; the
// test runs both under the same crashes.
package transfer
