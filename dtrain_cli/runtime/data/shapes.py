"""Built-in images for the BatchNorm recipe: shapes drawn from the seed, no download.

    dtrain launch recipe=cnn_bn dp=2 parallel.sync_batchnorm=true

Ten classes: five shapes (disc, square, ring, cross, bar) x two sizes, each at a random
position and colour on a noisy background, 3 x S x S floats. Sample ``i`` depends only on
``(seed, i)``, so every rank and every layout sees the same images.
"""

from __future__ import annotations

import numpy as np

SHAPES = ("disc", "square", "ring", "cross", "bar")


def draw(rng: np.random.Generator, label: int, size: int) -> np.ndarray:
    shape, big = SHAPES[label // 2], label % 2 == 1
    radius = size * (0.35 if big else 0.18)
    cy, cx = rng.uniform(radius, size - radius, 2)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    dy, dx = yy - cy, xx - cx
    if shape == "disc":
        mask = dy**2 + dx**2 <= radius**2
    elif shape == "square":
        mask = (abs(dy) <= radius) & (abs(dx) <= radius)
    elif shape == "ring":
        r2 = dy**2 + dx**2
        mask = (r2 <= radius**2) & (r2 >= (0.55 * radius) ** 2)
    elif shape == "cross":
        mask = ((abs(dy) <= radius * 0.3) | (abs(dx) <= radius * 0.3)) & (
            np.maximum(abs(dy), abs(dx)) <= radius
        )
    else:  # bar
        mask = (abs(dy) <= radius * 0.3) & (abs(dx) <= radius)
    colour = rng.uniform(0.5, 1.0, 3).astype(np.float32)
    img = rng.normal(0.0, 0.1, (3, size, size)).astype(np.float32)
    img += mask[None].astype(np.float32) * colour[:, None, None]
    return img


class ShapeImages:
    """``num`` drawn images, made once when opened (a few MB)."""

    def __init__(self, num: int, size: int, num_classes: int, seed: int, offset: int) -> None:
        if num_classes > 2 * len(SHAPES):
            raise ValueError(
                f"model.num_classes={num_classes}: the shapes data has {2 * len(SHAPES)} classes"
            )
        self.images = np.empty((num, 3, size, size), dtype=np.float32)
        self.labels = np.empty(num, dtype=np.int64)
        for i in range(num):
            rng = np.random.default_rng([seed, offset + i])
            label = int(rng.integers(num_classes))
            self.labels[i] = label
            self.images[i] = draw(rng, label, size)

    def __len__(self) -> int:
        return len(self.labels)

    def pairs(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.images[indices], self.labels[indices]
