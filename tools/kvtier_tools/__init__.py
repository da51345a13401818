"""kvtier-tools: the tooling around the kvtier store, a distribution of its own.

The workloads (`workloads`: the shipped Mooncake trace and the public-trace readers, trace
replays through a real Hierarchy, policy and chain simulations), the benchmarks (`bench`:
`kvtier bench` and `python -m kvtier_tools.bench.<name>`) and the commands that drive them
(`cli`: `kvtier replay`, `simulate`, `bench`, `demo`, joined to the `kvtier` command by an
entry point). It builds on kvtier; kvtier imports nothing from it, so the product's wheel
carries none of it.
"""
