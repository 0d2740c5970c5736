package saga

import (
	"encoding/json"
	"strings"

	failurepb "go.temporal.io/api/failure/v1"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/oncekit/oncekit/internal/sagarec"
)

// Bounds of a recorded cause: how deep its chain goes, and its size once encoded.
const (
	causeDepthMax = 8
	causeBytesMax = 64 << 10
)

// encodeCause records the failure a saga compensates for as Temporal encodes a failure
// (type, message, non-retryable, the activity it came from, its own causes), so that a
// run that replays the saga's outcome, or takes the saga over, rebuilds the same error,
// which errors.As and errors.Is see as the first run's. Stack traces are left out and
// messages bounded; a cause still too large is not recorded (the compensating record's ErrType and
// ErrMessage then stand for it).
func encodeCause(cause error) json.RawMessage {
	if cause == nil {
		return nil
	}
	f := temporal.GetDefaultFailureConverter().ErrorToFailure(cause)
	if f == nil {
		return nil
	}
	// The converter may hand back the failure the error was built from: change a copy.
	f = proto.Clone(f).(*failurepb.Failure)
	for i, level := 0, f; level != nil; i, level = i+1, level.GetCause() {
		level.StackTrace = ""
		level.Message = boundedText(level.GetMessage())
		if i == causeDepthMax-1 {
			level.Cause = nil
		}
	}
	b, err := protojson.Marshal(f)
	if err != nil || len(b) > causeBytesMax {
		return nil
	}
	return b
}

// decodeCause rebuilds a cause recorded by encodeCause, or returns nil.
func decodeCause(b json.RawMessage) error {
	if len(b) == 0 {
		return nil
	}
	var f failurepb.Failure
	if err := protojson.Unmarshal(b, &f); err != nil {
		return nil
	}
	return temporal.GetDefaultFailureConverter().FailureToError(&f)
}

// legacyMessage reports whether an outcome's message was recorded whole, as
// ApplicationError.Error() prints it (type and cause included), as runs did before the
// cause was recorded on its own: such a message is replayed as it is, without a cause.
func legacyMessage(r sagarec.Recorded) bool {
	return strings.Contains(r.ErrMessage, " (type: "+r.ErrType+", retryable: false)")
}
