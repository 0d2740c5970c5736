// Package agent makes an AI agent's tool calls happen once: an email sent, a ticket
// opened, a card refunded, whatever retries, redeliveries, crashes and take-overs the
// agent goes through, and whatever the model decides on a retry.
//
// # The key is the call's place, not its arguments
//
// A tool call is keyed by its place in the task: (tenant, task ID, step, tool), where
// the step is the call's position in the task or a call ID recorded before any effect
// ([Guard.Ref]). Its canonical JSON arguments are the fingerprint. A retry that reaches
// the same place with the same arguments replays the stored output ([Result].Replayed);
// one with other arguments, because the model changed its mind, is refused with an
// [*ArgumentsChangedError] that carries both argument sets, and the tool does not run
// again. Keying by the arguments instead would make a changed mind a new call, and
// send the email twice.
//
// # Tools
//
// [Task.Call] runs a tool that acts outside the database, such as an HTTP API: it claims
// the call's key with a lease and commits before the call, and records the outcome
// after it (ledger.Ledger.Claim and Complete). A tool whose provider deduplicates by a
// key ([Tool].AcceptsKey) receives [Invocation].DownstreamKey for an Idempotency-Key
// header, and a call whose answer was lost is made again with that key. A tool without
// one, such as SMTP, is never repeated: the call is reported with an [*UncertainError],
// to the model and, as a warning, to the operator, who settles it with
// [Guard.Resolve]. So is a call whose tool acted and whose output is over the ledger's
// body limit: nothing can be stored, and the [*UncertainError] wraps the
// ledger.BodyTooLargeError. A call whose claim's commit went unanswered returns an
// error that wraps a ledger.OutcomeUnknownError, and its tool has not started; a retry
// in the same process resumes the claim and runs the tool once. [Task.CallTx] runs a
// tool that writes only to the database inside the transaction that records the call,
// so both commit or neither.
//
// # Tasks
//
// An agent that polls for work claims a task with [Guard.ClaimTask]: a ledger record of
// its own, owned with a lease and an owner token, renewed by [Task.Heartbeat] and by
// every tool call, and ended by [Task.Finish], which its owner may retry. A tool call
// renews the claim in the transaction that claims the call, so a stale owner, whose
// task another agent took over, is refused with a [*StaleOwnerError] before its tool
// runs. The agent that takes a dead agent's task over uses the same step keys, and the
// dead agent's completed calls replay. An agent whose runtime owns the task, such as a
// Temporal workflow, uses [Guard.Task], whose calls are guarded and not fenced.
//
// # Approvals
//
// A tool with [Tool].NeedsApproval freezes each call (tool, arguments, key) before
// anyone sees it and returns an [*ApprovalPendingError]. [Guard.Waiting] lists the
// frozen calls; [Guard.Approve] and [Guard.Reject] name the frozen call's fingerprint,
// so a decision applies to the arguments the person saw. An approved call runs once;
// the same place with other arguments stays refused; a call nobody decided before
// [Config].ApprovalTimeout counts as rejected.
//
// # Hints
//
// MCP tools say of themselves whether they only read ([Hints]). With
// [Config].TrustHints a read-only tool runs without the ledger; a tool that says it is
// destructive is guarded whatever else it says.
//
// # Tables
//
// The calls' arguments and approvals live in the agent_calls table, the agent's
// migration line ([Migrations]), which migrate.Up applies after the ledger's.
package agent
