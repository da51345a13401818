"""What the shared tiers (`TierKind.shared`: stores many nodes write, like `kvtier.tiers.redis`
and `kvtier.tiers.sharedfs`) have in common: one authenticated value format (`value.py`),
its keys (`auth.py`), and the config fields that say where the key is (`config.py`)."""
