"""Adapters that embed kvtier in serving engines.

Each engine's adapter lives in its own subpackage and is the only code in kvtier that imports
that engine (`kvtier.integrations.vllm` needs the `kvtier[vllm]` extra); importing `kvtier`
imports none of them.
"""
