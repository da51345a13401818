"""Tiers: the storage interface (`storage.py`, `keyed.py`), the parts tiers share
(`codec.py`, `trusted.py`), the registry of tier kinds (`registry.py`), and one package per
tier (`pool/`, `disk/`, `redis/`, `sharedfs/`; `shared/` is what the shared ones have in
common). A tier package imports no other tier package."""
