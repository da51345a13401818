"""Block namespaces: what makes the bytes of a block mean the same KV to two readers.

A block's key names its tokens (a prefix hash); whether its bytes can be used by a reader
also depends on the model (weights, revision), the KV dtype and layout, the block size, and
who may see it (a tenant). Everything a tier stores is bound to the namespace made of those,
so a block of another model, layout or tenant is foreign (a miss), never data. A standalone
embedder names its model in `model_id` (include what changes the KV bytes: the revision or
fine-tune, the KV dtype, the layout); the vLLM adapter derives it from vLLM's configuration
and adds the config's `model_id` to it.
"""

from __future__ import annotations

import json

import xxhash

NAMESPACE_VERSION = 2
"""Bumped when what a namespace is made of changes (every shared tier then starts cold)."""


def block_namespace(model_id: str, block_size: int, tenant: str = "") -> str:
    """The canonical namespace string of blocks of `model_id`, `block_size` and `tenant`
    (JSON, so no two different triples give one string)."""
    return json.dumps(
        ["kvtier", NAMESPACE_VERSION, model_id, block_size, tenant], separators=(",", ":")
    )


def namespace_fingerprint(namespace: str) -> str:
    """16 hex characters naming a namespace in paths and key prefixes (a name, not a
    secret: what protects a shared tier is the keyed MAC bound to the whole namespace)."""
    return xxhash.xxh3_64_hexdigest(namespace.encode())


def combined_model_id(derived: str, configured: str) -> str:
    """A configured `model_id` added to one an embedder derived (model, KV dtype, layout):
    it can only narrow who shares blocks, never make two different models share them."""
    if not configured:
        return derived
    return json.dumps([derived, configured], separators=(",", ":"))
