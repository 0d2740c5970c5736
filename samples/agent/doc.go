// Command agent is the agent demo: a support agent polls a ticket inbox and, per ticket,
// asks a scripted model what to do and calls three tools against real local servers: a
// refund API and an email API that take an Idempotency-Key, as hosted APIs do, and a
// plain SMTP server, which takes no key. Three agents work side by side on their own
// copies of the inbox: one on package agent polling the inbox, the same agent as a
// Temporal workflow per ticket (package agenttemporal: the model call and the tools are
// activities), and a naive one written the way agent samples write it, with no guard
// and a retry on every failed call.
//
// Faults: agent processes and Temporal workers SIGKILL themselves right after tool
// effects and are restarted, the servers lose answers after acting, tickets are delivered twice, the
// model chooses other arguments on 10 % of retries, and refunds of 100 or more wait for
// an operator's approval (the demo approves up to 150 and rejects the rest). Every
// effect is counted in PostgreSQL, and the demo prints a table of both agents.
//
// It is a module of its own so that the SMTP library is a dependency of the demo alone.
// Run it with make agent-demo.
package main
