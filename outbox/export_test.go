package outbox

// BacklogSQL is the statement the backlog gauge runs at each collection.
func BacklogSQL(o *Outbox) string { return o.backlogSQL() }
