"""Put first on a child's PYTHONPATH by bench/hops.py: Python imports this before the program starts, and with
CRONOQ_BENCH_TRACE set it wraps cronoq's socket calls (bench/hop_trace.py) before anything imports them."""

import os

if os.environ.get("CRONOQ_BENCH_TRACE"):
    from bench.hop_trace import install

    install()
