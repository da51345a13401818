"""Tiers many nodes share: Redis (`medium = "redis"`, extra `kvtier[redis]`), with one
authenticated value format (`value.py`) and its keys (`auth.py`). Their config tables
(`config.py`) import no client library, so a config is checked before anything connects."""
