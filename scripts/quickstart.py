"""README's quick start: DDP with the Zen hook, one line. Run: torchrun --nproc-per-node 2 scripts/quickstart.py"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import zen

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.EmbeddingBag(100_000, 64), nn.Linear(64, 1))  # a 25.6 MB embedding table
ddp = DDP(model)
state = zen.ZenHookState(scheme="zen", sparse_params=model)
ddp.register_comm_hook(state, zen.ddp_hook)  # the one line: embedding rows through Zen, the rest dense

opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(dist.get_rank())
for step in range(5):
    ids = torch.randint(0, 100_000, (256, 8), generator=gen)  # each rank looks up ~2,000 rows
    loss = ddp(ids).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.4f}, received {state.bytes_received_last_step() / 1e6:.3f} MB "
              f"(dense allreduce: {2 * 25.6 * (dist.get_world_size() - 1) / dist.get_world_size():.1f} MB)")
dist.destroy_process_group()
