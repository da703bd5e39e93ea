"""What every cronoq process shares on the network: clients, workers and the broker all import it.

- protocol.py: every message type, its encoding, its size bounds, and the one decoder per direction;
- transport.py: a ZeroMQ socket on the asyncio loop, and the token frame every message starts with;
- dealer.py: the one DEALER a client or a worker talks to one broker (its primary and standbys) through;
- curve.py: CurveZMQ key files and how each side's socket is set up;
- link.py: what a socket monitor's events mean, in words a user can act on;
- clustermap.py: which member of a cluster owns which pool;
- logs.py: the structured log format of the broker and workers.
"""
