"""Workloads that drive the store: request traces, the replay of a trace through a real
hierarchy, policy simulation and the demo's references.

Tooling (kvtier-tools): kvtier never imports it; its commands (`kvtier_tools.cli`) draw the
results.
"""
