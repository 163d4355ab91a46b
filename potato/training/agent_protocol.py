"""The agent protocol's constants, shared by the server's routes (potato/protocol) and the agent.

One home for the numbers both sides must agree on (docs/agent-protocol.md);
the agent is part of the remote half, so they live here rather than beside
the routes, which import them from here.

Part of the remote half: Python 3.8, standard library only.
"""

PREFIX = "/training/agent/v1"       # every route is under it
PROTOCOL_VERSION = 1                # a claim's answer says which version the server speaks
POLL_INTERVAL_S = 1.0               # how often an idle agent asks for work (a claim's answer says so)
MAX_EVENTS_PER_BATCH = 1000         # the most worker events one post may carry
