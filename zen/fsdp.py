"""`zen.fsdp`: Zen as FSDP2's reduce-scatter (zen/integrations/fsdp.py), under its short name:
`import zen.fsdp; zen.fsdp.shard(model)`. Not imported by `import zen`."""

from zen.integrations.fsdp import GATHERS, SCHEMES, ZenFSDP, ZenReduceScatter, shard

__all__ = ["GATHERS", "SCHEMES", "ZenFSDP", "ZenReduceScatter", "shard"]
