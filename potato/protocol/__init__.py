"""The agent protocol (docs/agent-protocol.md): its one home, served by both of Potato's HTTP servers.

Two servers speak it: ``potato start`` beside the Training page and the
admin API (potato/server), and an ssh or slurm run's flow, alone, on the
run's private UNIX socket (potato/backends/ssh/protocol_server.py). Both take it
from here, so the layers read top-down: the web server and the flow's tasks
import the protocol; the protocol imports neither of them
(tests/unit/test_layers.py holds the rule).

- ``app``         serving it: on ``potato start``'s app, or alone for an ssh run's socket
- ``routes``      the views, thin: claim, bundle, status, events, predictions, result
- ``callers``     who a bearer token is and what it may do; read-only, so it runs before a body is read
- ``bodies``      what agents send, checked field by field
- ``predictions`` the upload, streamed and checked line by line
- ``state``       what the routes remember between requests; what a claim means for a run's state

Events are recorded by ``potato.runs.run_events``, which the local backend's relay
uses too; ``potato.protocol.jsonapi`` holds what both Flask apps share (JSON errors,
strict bodies, admitting a body before reading it).
"""
