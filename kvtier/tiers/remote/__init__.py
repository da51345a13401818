"""Tiers many nodes share: Redis (`medium = "redis"`, extra `kvtier[redis]`), with one
self-verifying value format (`value.py`). Their config tables (`config.py`) import no client
library, so a config is checked before anything connects."""
