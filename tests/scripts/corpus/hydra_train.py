"""A script that composes its own Hydra config (``@hydra.main``): overrides on its command line.

torchrun --nproc-per-node 2 hydra_train.py steps=5 lr=0.2 out=out hydra.run.dir=hydra
"""

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig
from report import write
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@hydra.main(config_path="hydra_conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.optimizer.momentum)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(cfg.steps):
        x = torch.randn(16, 6, generator=gen)
        loss = (model(x) - x.mean(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    total = torch.tensor(loss.item())
    dist.all_reduce(total)
    write(cfg.out, total.item() / dist.get_world_size(), lr=cfg.lr, steps=cfg.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
