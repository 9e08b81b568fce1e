"""Can the router's features tell task types apart at all? A cross-validated linear probe.

If a logistic regression on the head's own input features cannot predict a task's type on
held-out folds, no head trained on them can route by type, whatever its advantages; if it can,
a router that still routes uniformly has a learning problem, not a feature problem.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def _fit(x_NH: torch.Tensor, y_N: torch.Tensor, classes: int, l2: float, steps: int):
    w = torch.zeros(x_NH.shape[1], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x_NH @ w + b, y_N) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def probe_accuracy(
    features_NH: torch.Tensor,
    labels: Sequence[Hashable],
    folds: int = 5,
    seed: int = 0,
    l2: float = 1e-2,
    steps: int = 100,
) -> float:
    """Held-out accuracy of an L2-regularised multinomial logistic regression predicting
    ``labels`` from ``features_NH`` (standardised on each training fold), averaged over
    ``folds`` seeded folds: 1/#classes is chance for balanced classes."""
    n = features_NH.shape[0]
    if n != len(labels):
        raise ValueError(f"{n} feature rows but {len(labels)} labels")
    names = sorted(set(labels), key=str)
    if len(names) < 2 or n < folds or folds < 2:
        raise ValueError(f"a probe needs ≥ 2 classes and ≥ {max(folds, 2)} rows, got {n}")
    y = torch.tensor([names.index(v) for v in labels])
    x = features_NH.detach().float().cpu()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    correct = 0
    for k in range(folds):
        test = order[k::folds]
        train = torch.ones(n, dtype=torch.bool)
        train[test] = False
        mu, sd = x[train].mean(0), x[train].std(0).clamp(min=1e-6)
        w, b = _fit((x[train] - mu) / sd, y[train], len(names), l2, steps)
        pred = (((x[test] - mu) / sd) @ w + b).argmax(-1)
        correct += int((pred == y[test]).sum())
    return correct / n
