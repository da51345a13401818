"""The Redis tier (`medium = "redis"`, extra `kvtier[redis]`): blocks in a Redis server or
cluster many nodes share. `kind.py` is its config table and declarations (imported when a
config is validated; no client library), `storage.py` its `RedisStorage` and opener."""
