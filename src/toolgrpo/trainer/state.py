"""What a training checkpoint holds and how a run resumes from one.

Layout of ``checkpoints/global_step_N``: ``model/`` (safetensors ``from_pretrained`` loads; LoRA
merged), ``adapter/`` (LoRA runs), ``optimizer.pt`` (optimizer, scheduler, value head, KL
controller), ``router.pt`` (router head, budget state and the threshold τ the last validation
calibrated, with ``router.enable``), ``trainer_state.json`` (step, sampler position, config,
the base model's identity) — written last. The ``.pt`` files hold tensors and plain containers
only and are read weights-only: loading one never runs code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig, as_dict
from toolgrpo.distributed.fsdp import (
    FsdpOptimizerView,
    Ranks,
    full_module_state,
    full_optimizer_state,
    load_full_into,
    load_full_module_state,
)
from toolgrpo.models.identity import BASE_KEY, base_identity, check_base
from toolgrpo.models.loading import Policy, save_hf_model
from toolgrpo.models.safe_load import CorruptCheckpoint
from toolgrpo.router.calibrate import THRESHOLD_KEY, Threshold
from toolgrpo.router.infer import ROUTER_FILE
from toolgrpo.trainer.checkpoint import (
    load_torch,
    read_state,
    save_torch,
    write_checkpoint,
)
from toolgrpo.trainer.config_diff import check_resume_config, load_optimizer
from toolgrpo.trainer.resume import announce, pick_checkpoint

if TYPE_CHECKING:
    from toolgrpo.algos import AdaptiveKLController, FixedKLController
    from toolgrpo.router.runtime import RouterRuntime
    from toolgrpo.trainer.actor import Actor
    from toolgrpo.trainer.sampler import TaskSampler


@dataclass(frozen=True)
class RunState:
    """What a checkpoint saves and a resume restores: the run's weights (``policy``, sharded in
    ``actor`` with fsdp2), optimizer and scheduler, KL coefficient, task order and router, with
    the config it is checked against and the output directory it lives in."""

    cfg: TrainConfig
    out: Path
    ranks: Ranks
    policy: Policy
    actor: Actor
    kl_ctrl: FixedKLController | AdaptiveKLController
    sampler: TaskSampler
    router: RouterRuntime | None = None


@dataclass
class Resumed:
    """Where a resume left the run: the checkpoint's step (0: a fresh start) and the τ of
    threshold routing it held (None without the router or a calibration)."""

    step: int = 0
    calibration: Threshold | None = None


def save(run: RunState, step: int, calibration: Threshold | None = None) -> Path | None:
    """Write ``global_step_N`` (rank 0), with ``calibration`` (the last validation's τ) in
    ``router.pt``. Sharded, every rank calls it: the optimizer state and the value head are
    gathered whole and stored as one process stores them, so any world size resumes from it."""
    policy, actor = run.policy, run.actor
    full_ft = not policy.is_lora
    head = actor.value_head
    if actor.root is not None:
        optimizer_state = full_optimizer_state(actor.root, actor.optimizer)
        value_head = full_module_state(head) if head is not None else None
        if not run.ranks.main:
            return None
    else:
        optimizer_state = actor.optimizer.state_dict()
        value_head = head.state_dict() if head is not None else None

    def payload(d: Path) -> None:
        if policy.is_lora:
            policy.model.save_pretrained(d / "adapter")
        if full_ft or run.cfg.trainer.save_hf_model:
            save_hf_model(policy, d / "model")
        save_torch(
            {
                "optimizer": optimizer_state,
                "scheduler": actor.scheduler.state_dict(),
                "value_head": value_head,
                "kl_coef": run.kl_ctrl.value,
            },
            d / "optimizer.pt",
        )
        if run.router is not None:
            router = run.router.state_dict()
            if calibration is not None:  # τ of threshold routing (infer, eval)
                router[THRESHOLD_KEY] = calibration.to_state()
            save_torch(router, d / ROUTER_FILE)

    state = {
        "global_step": step,
        "sampler": run.sampler.state_dict(),
        "is_lora": policy.is_lora,
        "config": as_dict(run.cfg),
        BASE_KEY: current_base(run.cfg, run.policy),  # eval, infer, resume refuse another base
    }
    return write_checkpoint(run.out, step, state, payload, keep=run.cfg.trainer.max_checkpoints)


MODEL_KEY = "actor_rollout_ref.model.path"


def current_base(cfg: TrainConfig, policy: Policy) -> dict[str, str]:
    """The identity of the base model this run trains (``models/identity.py``)."""
    return base_identity(cfg.actor_rollout_ref.model.path, policy.resolved.hf_dir)


@dataclass
class Saved:
    """A checkpoint read whole into memory before anything is applied, so a corrupt file is
    found before the run's state is touched."""

    state: dict[str, Any]
    weights: dict[str, torch.Tensor]
    opt: dict[str, Any]
    router: dict[str, Any] | None


def read_weights(ckpt: Path, is_lora: bool) -> dict[str, torch.Tensor]:
    """The trainable weights: the LoRA adapter, or the full model's safetensors."""
    if is_lora:
        files = [ckpt / "adapter" / "adapter_model.safetensors"]
    else:
        files = sorted((ckpt / "model").glob("*.safetensors"))
    if not files or not all(f.is_file() for f in files):
        want = "adapter/adapter_model.safetensors" if is_lora else "model/*.safetensors"
        raise CorruptCheckpoint(f"{ckpt} has no {want}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as e:  # safetensors raises its own error type for torn files
            raise CorruptCheckpoint(f"{f} is unreadable ({str(e).splitlines()[0]})") from None
    return weights


def apply_weights(policy: Policy, weights: dict[str, torch.Tensor], ckpt: Path) -> None:
    """Load read weights into ``policy``; weights of another shape are a one-line error."""
    try:
        if policy.is_lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(policy.model, weights)
            return
        missing, unexpected = policy.model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # size mismatches
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e))
        raise ConfigError(f"{ckpt}: weights do not fit the model ({first[:300]})") from None
    tied = policy.model.config.tie_word_embeddings
    allowed = {k for k in missing if "lm_head" in k} if tied else set()
    if set(missing) - allowed or unexpected:
        raise ConfigError(f"{ckpt}: weights do not fit the model ({missing}, {unexpected})")


def check_lora(ckpt: Path, is_lora: bool, policy: Policy) -> None:
    """A LoRA checkpoint resumes only a LoRA run, and a full one only a full one."""
    if bool(is_lora) != policy.is_lora:
        raise ConfigError(f"{ckpt} was saved with is_lora={is_lora}; the config disagrees")


def read(ckpt: Path) -> Saved:
    """Every file of a GRPO checkpoint, checked; ``CorruptCheckpoint`` names the first bad one."""
    state = read_state(ckpt)
    weights = read_weights(ckpt, bool(state["is_lora"]))
    opt = load_torch(ckpt / "optimizer.pt")
    if not isinstance(opt, dict) or not {"optimizer", "scheduler"} <= opt.keys():
        raise CorruptCheckpoint(f"{ckpt / 'optimizer.pt'} lacks the optimizer or scheduler")
    router_cfg = (state.get("config") or {}).get("router")
    had_router = isinstance(router_cfg, dict) and bool(router_cfg.get("enable", False))
    router = load_torch(ckpt / ROUTER_FILE) if had_router or (ckpt / ROUTER_FILE).exists() else None
    return Saved(state, weights, opt, router)


def resume(run: RunState) -> Resumed:
    """Restore the newest intact checkpoint (per ``trainer.resume``) after checking the config
    against the one it was saved with; returns its step (0: a fresh start) and router τ."""
    ranks = run.ranks
    if not ranks.main:  # sharded: rank 0 picks (it may rename a corrupt one), the rest follow
        picked = ranks.broadcast(None)
        if picked is None:
            return Resumed()
        ckpt = Path(picked)
        saved = Saved(read_state(ckpt), {}, load_torch(ckpt / "optimizer.pt"), None)
        return Resumed(int(saved.state["global_step"]), apply(run, ckpt, saved))
    found = pick_checkpoint(run.out, run.cfg.trainer.resume, read)
    ranks.broadcast(None if found is None else str(found[0]))
    if found is None:
        return Resumed()
    ckpt, saved = found
    step = int(saved.state["global_step"])
    check_base(ckpt, saved.state.get(BASE_KEY), current_base(run.cfg, run.policy), MODEL_KEY)
    changes = check_resume_config(ckpt, saved.state.get("config"), as_dict(run.cfg), step)
    calibration = apply(run, ckpt, saved)
    announce(ckpt, step, changes)
    return Resumed(step, calibration)


def apply(run: RunState, ckpt: Path, saved: Saved) -> Threshold | None:
    """Weights, optimizer (with the config's hyperparameters), sampler, KL and router state;
    returns the router's saved τ (None without the router or a calibration)."""
    policy, actor, opt = run.policy, run.actor, saved.opt
    optimizer: Any = actor.optimizer
    calibration = None
    if run.ranks.main:
        check_lora(ckpt, saved.state["is_lora"], policy)
        apply_weights(policy, saved.weights, ckpt)
    if actor.root is not None:  # sharded: rank 0's whole weights into every rank's shards
        trainable = {}
        if run.ranks.main:
            named = policy.model.named_parameters()
            trainable = {n: p.detach() for n, p in named if p.requires_grad}
        load_full_into(actor.root, trainable)
        optimizer = FsdpOptimizerView(actor.root, actor.optimizer)
    load_optimizer(optimizer, actor.scheduler, opt["optimizer"], opt["scheduler"], ckpt)
    if actor.value_head is not None and opt.get("value_head") is not None:
        if actor.root is not None:  # every rank read it; rank 0's goes into the shards
            load_full_module_state(actor.root, "value_head", opt["value_head"])
        else:
            actor.value_head.load_state_dict(opt["value_head"])
    # An adaptive coefficient is state; a fixed one is config (a changed kl_coef applies).
    if hasattr(run.kl_ctrl, "target") and opt.get("kl_coef") is not None:
        run.kl_ctrl.value = float(opt["kl_coef"])
    if run.router is not None and saved.router is not None:
        # head, λ, dual window; refused when this run's route prompts differ from the saved ones
        run.router.load_state_dict(saved.router, str(ckpt / ROUTER_FILE))
        calibration = Threshold.from_state(saved.router.get(THRESHOLD_KEY))
    run.sampler.load_state_dict(saved.state["sampler"])
    return calibration
