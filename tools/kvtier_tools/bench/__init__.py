"""kvtier's benchmarks: figures to print and compare, never timed tests (docs/BENCHMARKS.md).

Tooling (kvtier-tools) beside the product, which never imports it. The data-path and
write-path benchmarks are the `kvtier bench` command (`python -m kvtier.cli bench`); the
others run as `python -m kvtier_tools.bench.<name>`:

- `datapath`: kvtier's copies and disk I/O against this machine's own limits (`kvtier bench`).
- `writepath`: what a serving engine waits for when it offloads: put and get latency, demotion
  throughput (`kvtier bench --write-path`).
- `bookkeeping`: `TierManager` block-operations per second against vLLM's own CPU offloading
  manager, replaying the shipped Mooncake trace.
- `disk_recovery`: how long a disk store takes to open after a clean close, a kill, a lost or
  a truncated index.
- `vllm_tiers`: kvtier's disk tier against vLLM's `fs` tier under vLLM's tiering manager.
- `remote_tiers`: the Redis and shared-fs tiers against their plain clients.
- `policy_speed`: the policies' bookkeeping speed against vLLM's own `LRUCachePolicy` and
  `ARCCachePolicy`.
- `lct_tuning`: `lct`'s parameters chosen on the first half of the shipped trace, reported on
  the second half and the whole.
- `policy_traces`: the policies' hit ratios across traces and generated workloads.
- `engine_ttft`: time to first token of vLLM's CPU engine with and without kvtier underneath
  (run with `.venv-engine/bin/python`, where vLLM's CPU build is): a cached prefix, and a
  multi-turn workload reported by turn depth (`engine_turns`); `greedy_match` is its rule
  (and the engine lane's) for telling a top-2 tie from a wrong token.
"""
