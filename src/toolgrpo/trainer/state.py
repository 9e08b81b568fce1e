"""What a training checkpoint holds and how a run resumes from one.

Layout of ``checkpoints/global_step_N``: ``model/`` (safetensors ``from_pretrained`` loads; LoRA
merged), ``adapter/`` (LoRA runs), ``optimizer.pt`` (optimizer, scheduler, value head, KL
controller), ``router.pt`` (router head and budget state, with ``router.enable``),
``trainer_state.json`` (step, sampler position, config) — written last.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from safetensors.torch import load_file

from toolgrpo.config.schema import as_dict
from toolgrpo.models.loading import Policy, save_hf_model
from toolgrpo.router.infer import ROUTER_FILE
from toolgrpo.trainer.checkpoint import (
    latest_checkpoint,
    load_torch,
    read_state,
    save_torch,
    write_checkpoint,
)

if TYPE_CHECKING:
    from toolgrpo.trainer.trainer import Trainer


def find_resume_point(resume: str, output_dir: Path) -> Path | None:
    """``auto``: the latest complete checkpoint, if any; ``disable``: none; else that directory."""
    if resume == "disable":
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    p = Path(resume)
    if not (p / "trainer_state.json").is_file():
        raise FileNotFoundError(f"trainer.resume={resume!r} is not a checkpoint directory")
    return p


def save(trainer: Trainer, step: int) -> Path:
    policy, actor = trainer.policy, trainer.actor
    full_ft = not policy.is_lora

    def payload(d: Path) -> None:
        if policy.is_lora:
            policy.model.save_pretrained(d / "adapter")
        if full_ft or trainer.cfg.trainer.save_hf_model:
            save_hf_model(policy, d / "model")
        save_torch(
            {
                "optimizer": actor.optimizer.state_dict(),
                "scheduler": actor.scheduler.state_dict(),
                "value_head": actor.value_head.state_dict() if actor.value_head else None,
                "kl_coef": trainer.kl_ctrl.value,
            },
            d / "optimizer.pt",
        )
        if trainer.router is not None:
            save_torch(trainer.router.state_dict(), d / ROUTER_FILE)

    state = {
        "global_step": step,
        "sampler": trainer.sampler.state_dict(),
        "is_lora": policy.is_lora,
        "config": as_dict(trainer.cfg),
    }
    return write_checkpoint(
        trainer.out, step, state, payload, keep=trainer.cfg.trainer.max_checkpoints
    )


def load_weights(policy: Policy, ckpt: Path, is_lora: bool) -> None:
    """Load a checkpoint's trainable weights (LoRA adapter, or full model) into ``policy``."""
    if is_lora != policy.is_lora:
        raise ValueError(f"{ckpt} was saved with is_lora={is_lora}; the config disagrees")
    if policy.is_lora:
        from peft import set_peft_model_state_dict

        weights = load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))
        set_peft_model_state_dict(policy.model, weights)
        return
    weights = {}
    for f in sorted((ckpt / "model").glob("*.safetensors")):
        weights.update(load_file(str(f)))
    missing, unexpected = policy.model.load_state_dict(weights, strict=False)
    tied = policy.model.config.tie_word_embeddings
    allowed = {k for k in missing if "lm_head" in k} if tied else set()
    if set(missing) - allowed or unexpected:
        raise ValueError(f"{ckpt}: weights do not fit the model ({missing}, {unexpected})")


def load(trainer: Trainer, ckpt: Path) -> int:
    """Restore weights, optimizer, sampler and KL state; returns the checkpoint's step."""
    state = read_state(ckpt)
    policy, actor = trainer.policy, trainer.actor
    load_weights(policy, ckpt, state["is_lora"])
    opt = load_torch(ckpt / "optimizer.pt")
    actor.optimizer.load_state_dict(opt["optimizer"])
    actor.scheduler.load_state_dict(opt["scheduler"])
    if actor.value_head is not None and opt["value_head"] is not None:
        actor.value_head.load_state_dict(opt["value_head"])
    if hasattr(trainer.kl_ctrl, "value"):
        trainer.kl_ctrl.value = opt["kl_coef"]
    if trainer.router is not None and (ckpt / ROUTER_FILE).is_file():
        trainer.router.load_state_dict(load_torch(ckpt / ROUTER_FILE))  # head, λ, dual window
    trainer.sampler.load_state_dict(state["sampler"])
    return int(state["global_step"])
