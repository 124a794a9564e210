"""Image models for the device-coverage tests: a ResNet-style CNN whose blocks use grouped
and dilated convolutions, and an encoder-decoder that upsamples bilinearly."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class GroupedBlock(nn.Module):
    """ResNeXt-style bottleneck: 1x1, grouped (and dilated) 3x3, 1x1, batch norms,
    a residual connection (strided 1x1 projection when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, groups: int, dilation: int, stride: int = 1):
        super().__init__()
        mid = c_out // 2
        self.reduce = nn.Conv2d(c_in, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.grouped = nn.Conv2d(mid, mid, 3, stride=stride, padding=dilation,
                                 dilation=dilation, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.expand = nn.Conv2d(mid, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.skip = (nn.Identity() if c_in == c_out and stride == 1 else
                     nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                   nn.BatchNorm2d(c_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.reduce(x)))
        y = F.relu(self.bn2(self.grouped(y)))
        return F.relu(self.bn3(self.expand(y)) + self.skip(x))


class GroupedResNet(nn.Module):
    """Stem, max pool, three grouped/dilated bottlenecks, global average pool, linear."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.blocks = nn.Sequential(GroupedBlock(16, 32, groups=4, dilation=1),
                                    GroupedBlock(32, 32, groups=8, dilation=2),
                                    GroupedBlock(32, 64, groups=4, dilation=1, stride=2))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class UpsamplingNet(nn.Module):
    """A small encoder-decoder (segmentation-style): strided convolutions down, bilinear
    upsampling back up with a skip connection, a 1x1 classifier per pixel."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.down1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.down2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.up1 = nn.Conv2d(16 + 8, 8, 3, padding=1)
        self.classify = nn.Conv2d(8, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = F.relu(self.down1(x))
        d2 = F.relu(self.down2(d1))
        u = F.interpolate(d2, scale_factor=2, mode="bilinear", align_corners=False)
        u = F.relu(self.up1(torch.cat([u, d1], dim=1)))
        u = F.interpolate(u, size=x.shape[-2:], mode="bilinear", align_corners=True)
        return self.classify(u)
