"""Resuming with a changed config: what differs from the checkpoint's config, which changes
cannot apply (the saved weights or optimizer state would not fit or mean something else), and
optimizer hyperparameters set from the current config rather than kept from the checkpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from toolgrpo.config.loader import ConfigError

# Where the run is written and how it resumes: not part of what the run is.
IGNORED = frozenset({"trainer.resume", "trainer.output_dir", "trainer.overwrite_output_dir"})

# The trained weights (and their optimizer state) belong to this model and adapter shape.
_MODEL = ("path", "lora_rank", "lora_alpha", "target_modules", "adapter_path", "trust_remote_code")
REFUSED = frozenset(
    [f"actor_rollout_ref.model.{k}" for k in _MODEL]  # GRPO / PPO
    + [f"model.{k}" for k in _MODEL]  # SFT
    + ["router.enable", "router.routes", "router.head_hidden", "router.pooling"]
    + ["router.inputs", "router.feature_layer", "router.feature_norm"]
)

# Read from the config after the optimizer state is loaded (``restore_hparams``).
_OPTIM = ("lr", "weight_decay", "betas")
APPLIED = frozenset(
    [f"actor_rollout_ref.actor.optim.{k}" for k in _OPTIM]
    + [f"optim.{k}" for k in _OPTIM]
    + ["critic.lr", "router.lr"]
)
_SCHEDULE = ("lr_warmup_steps", "warmup_style", "min_lr_ratio")
SCHEDULE = frozenset(
    [f"actor_rollout_ref.actor.optim.{k}" for k in _SCHEDULE]
    + [f"optim.{k}" for k in _SCHEDULE]
    + ["trainer.total_training_steps", "trainer.total_epochs"]
)


@dataclass(frozen=True)
class Change:
    key: str  # dotted
    old: Any
    new: Any

    @property
    def refused(self) -> bool:
        return self.key in REFUSED

    def describe(self, step: int) -> str:
        if self.refused:
            note = "cannot apply"
        elif self.key in APPLIED and self.key.endswith("lr"):
            note = "applied: set in the optimizer's param groups and the scheduler's base lrs"
        elif self.key in APPLIED:
            note = "applied: set in the optimizer's param groups"
        elif self.key in SCHEDULE:
            note = "applied: the lr schedule follows the new value"
        else:
            note = f"takes effect from step {step + 1}"
        return f"{self.key}: {self.old!r} → {self.new!r} ({note})"


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flatten(v, key) if isinstance(v, dict) and v else {key: v})
    return out


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    """Keys whose value differs, dotted; keys present on one side only (a newer or older
    toolgrpo's schema) are left out, as are the ``IGNORED`` ones."""
    norm = json.loads(json.dumps(current, default=str))  # as the checkpoint stored it
    old, new = _flatten(saved), _flatten(norm)
    return [
        Change(k, old[k], new[k])
        for k in sorted(old.keys() & new.keys())
        if k not in IGNORED and old[k] != new[k]
    ]


def check_resume_config(
    ckpt: Any, saved: dict[str, Any] | None, current: dict[str, Any], step: int
) -> list[Change]:
    """Raise a one-line ``ConfigError`` if a change cannot apply; else the changes to report."""
    if not saved:
        return []
    changes = config_changes(saved, current)
    bad = [c for c in changes if c.refused]
    if bad:
        what = "; ".join(f"{c.key} {c.old!r} → {c.new!r}" for c in bad)
        raise ConfigError(
            f"cannot resume from {ckpt}: {what} changed, and the checkpoint's weights and "
            "optimizer state belong to the old value; use a new trainer.output_dir "
            "(or set trainer.overwrite_output_dir=true to move this run aside)"
        )
    return changes


_HPARAMS = ("betas", "weight_decay", "eps", "momentum", "dampening")


def snapshot_hparams(optimizer: Any, scheduler: Any = None) -> dict[str, Any]:
    """The config's optimizer hyperparameters, taken before a checkpoint's state replaces them."""
    groups = [
        {k: g[k] for k in (*_HPARAMS, "lr", "initial_lr") if k in g} for g in optimizer.param_groups
    ]
    base = list(scheduler.base_lrs) if scheduler is not None else None
    return {"groups": groups, "base_lrs": base}


def restore_hparams(optimizer: Any, scheduler: Any, snap: dict[str, Any]) -> None:
    """Put the config's hyperparameters back after ``load_state_dict`` (which restores the
    checkpoint's): base lrs from the config, the current lr from the schedule at its step."""
    for g, fresh in zip(optimizer.param_groups, snap["groups"], strict=True):
        g.update({k: v for k, v in fresh.items() if k in _HPARAMS})
        if scheduler is None:
            g["lr"] = fresh["lr"]
    if scheduler is None:
        return
    scheduler.base_lrs = list(snap["base_lrs"])
    lambdas = getattr(scheduler, "lr_lambdas", None)
    for i, (g, base) in enumerate(zip(optimizer.param_groups, scheduler.base_lrs, strict=True)):
        g["initial_lr"] = base
        g["lr"] = base * lambdas[i](scheduler.last_epoch) if lambdas else base
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def load_optimizer(
    optimizer: Any, scheduler: Any, opt_state: Any, sched_state: Any, ckpt: Any
) -> None:
    """Load a checkpoint's optimizer and scheduler state, keeping the config's hyperparameters;
    state that does not fit this run's parameters is a one-line error, not a traceback."""
    snap = snapshot_hparams(optimizer, scheduler)
    try:
        optimizer.load_state_dict(opt_state)
        if scheduler is not None and sched_state is not None:
            scheduler.load_state_dict(sched_state)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"cannot resume from {ckpt}: its optimizer state does not fit this run's trainable "
            f"parameters ({reason}); use a new trainer.output_dir"
        ) from None
    for p, st in optimizer.state.items():
        for v in st.values():
            if hasattr(v, "shape") and v.dim() > 0 and v.shape != p.shape:
                raise ConfigError(
                    f"cannot resume from {ckpt}: its optimizer state has shape "
                    f"{tuple(v.shape)} for a parameter of shape {tuple(p.shape)}; "
                    "use a new trainer.output_dir"
                )
    restore_hparams(optimizer, scheduler, snap)
