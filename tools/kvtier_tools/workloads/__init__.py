"""Workloads that drive the store: request traces, the replay of a trace through a real
hierarchy, policy simulation and the demo's references.

Tooling: the core never imports it; the command line (`kvtier.cli`) draws its results.
"""
