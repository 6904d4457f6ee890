"""A hand-written binary focal loss that takes the log of a sigmoid: NaN once a logit is large.

Adapted from kornia/kornia#2115 (fixed by kornia/kornia#2125): the loss was computed as
target * log(sigmoid(x)) + (1 - target) * log(sigmoid(-x)). For a large logit, sigmoid(-x)
rounds to exactly 0 in float32, its log is -inf, and 0 * -inf is NaN: the loss turns NaN on a
confident, correct prediction (here a sensor that saturates at 1023 and is rightly called an
alarm). The fix is F.logsigmoid (log(sigmoid(x)) in one stable op).
"""

import torch
from torch import nn

torch.manual_seed(0)
readings = torch.rand(128, 6) * 10
alarm = (readings[:, 0] > 6).float()
saturated = [17, 58, 93]  # the first sensor pegged at its maximum: clearly an alarm
readings[saturated, 0] = 1023.0
alarm[saturated] = 1.0
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(readings, alarm), batch_size=16,
                                     shuffle=True)
detector = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.Adam(detector.parameters(), lr=0.05)


def focal_loss(logits, target, gamma=2.0, alpha=0.25):
    """Binary focal loss, written out term by term."""
    prob = torch.sigmoid(logits)
    positive = -alpha * (1 - prob) ** gamma * target * torch.log(torch.sigmoid(logits))
    negative = -(1 - alpha) * prob ** gamma * (1 - target) * torch.log(torch.sigmoid(-logits))
    return (positive + negative).mean()


for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        loss = focal_loss(detector(x).squeeze(1), y)
        loss.backward()
        opt.step()
