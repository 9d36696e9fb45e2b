"""A LightningModule trained by ``Trainer(strategy="ddp")`` (Lightning reads torchrun's env).

torchrun --nproc-per-node 2 lightning_ddp.py --out out
"""

import argparse
import os

import lightning as L
import torch
from report import write
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    x = torch.randn(128, 8)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = Regressor()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        strategy="ddp",
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=8))
    total = sum(p.detach().sum().item() for p in model.parameters())
    write(args.out, model.losses[-1], param_sum=total, world=trainer.world_size)


if __name__ == "__main__":
    main()
