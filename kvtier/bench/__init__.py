"""Benchmarks of kvtier (figures to print and compare, not timed tests).

`kvtier.bench.bookkeeping`: bookkeeping throughput of `TierManager` against vLLM's CPU
offloading manager, replaying the shipped Mooncake trace.
"""
