"""Fine-tuning a pruned network with the optimizer that was built before the pruning.

Adapted from microsoft/nni#4521: the optimizer was created for the full model, then the
pruning "speed-up" swapped the pruned layers for smaller new modules (copying the kept rows and
columns into them), and fine-tuning went on with the same optimizer. That optimizer still
holds the tensors of the layers that were swapped out, which the forward no longer uses; the
new layers are in no optimizer, so they never change (the maintainer: the parameters the
optimizer holds are outdated; build a new optimizer after the speed-up).
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
points = torch.randn(96, 10)
classes = (points[:, :3].sum(1) > 0).long() + (points[:, 5] > 0.8).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(points, classes), batch_size=16,
                                     shuffle=True)

net = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 3))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def prune_hidden_units(model, keep):
    """Keep the `keep` first-layer units with the largest L1 norm: smaller modules replace the old ones."""
    first, second = model[0], model[2]
    kept = first.weight.abs().sum(dim=1).topk(keep).indices.sort().values
    slim_first = nn.Linear(first.in_features, keep)
    slim_second = nn.Linear(keep, second.out_features)
    with torch.no_grad():
        slim_first.weight.copy_(first.weight[kept])
        slim_first.bias.copy_(first.bias[kept])
        slim_second.weight.copy_(second.weight[:, kept])
        slim_second.bias.copy_(second.bias)
    model[0], model[2] = slim_first, slim_second


prune_hidden_units(net, keep=12)

# Fine-tune the pruned network (still with the optimizer created above).
for epoch in range(5):
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
