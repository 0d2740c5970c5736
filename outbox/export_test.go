package outbox

// BacklogSQL is the statement the backlog gauge runs at each collection.
func BacklogSQL(o *Outbox) string { return o.backlogSQL() }

// PurgeSQL is the statement each batch of a purge runs.
func PurgeSQL(o *Outbox) string { return o.purgeSQL().Local }
