"""A GAN in a LightningModule with manual optimization: two optimizers, one training_step.

Style imitated: Lightning's manual-optimization guide ("Use multiple optimizers (like
GANs)": ``self.automatic_optimization = False``, ``opt_g, opt_d = self.optimizers()``,
``self.toggle_optimizer``, ``self.manual_backward``, ``opt.step()``, ``opt.zero_grad()``).
Written for this corpus, not copied. Patterns it exercises:

- ``automatic_optimization = False``; each ``training_step`` updates the discriminator,
  then the generator (``--d_only`` skips the generator: one optimizer step a batch);
- ``self.manual_backward(loss)`` with ``toggle_optimizer``/``untoggle_optimizer``;
- ``Trainer(max_steps=...)``: Lightning counts every ``opt.step()`` as a global step, so
  ``max_steps=8`` is 4 batches of the two-optimizer GAN;
- ``--min_steps``: a Trainer that refuses to stop early before that many steps;
- noise from torch's global RNG, seeded by ``seed_everything``.

    python lightning_manual.py --max_steps 8
    bisect capture -o gan.trace --steps 4 -- python lightning_manual.py

CPU, a tiny MLP generator and discriminator on a 2-D Gaussian; writes nothing.
"""

import argparse
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L

warnings.filterwarnings("ignore", ".*does not have many workers.*")


class GAN(L.LightningModule):
    def __init__(self, latent=4, hidden=16, lr=0.01, d_only=False):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        z = torch.randn(real.shape[0], self.hparams.latent, device=real.device)

        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        d_loss = bce(self.discriminator(real), torch.ones(len(real), 1)) + bce(
            self.discriminator(fake), torch.zeros(len(real), 1))
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log("d_loss", d_loss)

        if not self.hparams.d_only:
            self.toggle_optimizer(opt_g)
            g_loss = bce(self.discriminator(self.generator(z)), torch.ones(len(real), 1))
            self.manual_backward(g_loss)
            opt_g.step()
            opt_g.zero_grad()
            self.untoggle_optimizer(opt_g)
            self.log("g_loss", g_loss)

    def configure_optimizers(self):
        lr = self.hparams.lr
        return (torch.optim.Adam(self.generator.parameters(), lr=lr),
                torch.optim.Adam(self.discriminator.parameters(), lr=lr))


def main():
    p = argparse.ArgumentParser(description="GAN with manual optimization")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--max_steps", type=int, default=8)
    p.add_argument("--min_steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--d_only", action="store_true")
    args = p.parse_args()

    L.seed_everything(args.seed)
    g = torch.Generator().manual_seed(0)
    real = torch.randn(128, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0])
    loader = DataLoader(TensorDataset(real), batch_size=16, shuffle=True, generator=g)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=args.max_steps, min_steps=args.min_steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(GAN(lr=args.lr, d_only=args.d_only), loader)
    print(f"global step {trainer.global_step}")


if __name__ == "__main__":
    main()
