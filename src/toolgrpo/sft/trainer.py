"""Supervised fine-tuning on assistant tokens (full or LoRA), with the training loop's outputs:
metrics.jsonl, TensorBoard, atomic checkpoints with resume, and a final adapter/model."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from toolgrpo.config.loader import to_yaml
from toolgrpo.config.schema import as_dict
from toolgrpo.config.validate import validate_sft_config
from toolgrpo.envs.plugins import load_run_plugins
from toolgrpo.models.identity import BASE_KEY, base_identity, check_base, record_adapter_base
from toolgrpo.models.loading import (
    load_policy,
    load_tokenizer,
    save_hf_model,
    trainable_parameters,
)
from toolgrpo.models.logprobs import masked_token_logprobs
from toolgrpo.models.registry import resolve_model
from toolgrpo.models.safe_load import CorruptCheckpoint
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.run_log import RunLog
from toolgrpo.sft.config import SFTConfig
from toolgrpo.sft.data import SFTExample, build_examples
from toolgrpo.trainer.checkpoint import load_torch, read_state, save_torch, write_checkpoint
from toolgrpo.trainer.config_diff import check_resume_config, load_optimizer
from toolgrpo.trainer.optim import clip_grad_norm, lr_factor
from toolgrpo.trainer.resume import announce, pick_checkpoint, prepare_output_dir
from toolgrpo.trainer.run_dir import write_text
from toolgrpo.trainer.sampler import TaskSampler
from toolgrpo.trainer.state import apply_weights, check_lora, read_weights
from toolgrpo.trainer.tracking import Tracker


def pad_examples(examples: list[SFTExample], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and loss mask."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    loss = torch.zeros_like(ids)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        attn[i, :n] = 1
        loss[i, :n] = torch.tensor(e.loss_mask)
    return ids, attn, loss


def data_hash(examples: list[SFTExample]) -> str:
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.input_ids, e.loss_mask]).encode())
    return h.hexdigest()


class SFTTrainer:
    def __init__(self, cfg: SFTConfig) -> None:
        load_run_plugins(cfg)  # trainer.imports (and the CLI's --import), as toolgrpo train
        validate_sft_config(cfg)
        self.cfg = cfg
        t, d = cfg.trainer, cfg.data
        # Data before the model: a bad file fails in seconds. Examples need only the tokenizer.
        tok = load_tokenizer(resolve_model(cfg.model.path).hf_dir)
        self.examples, self.dropped = build_examples(
            tok, d.train_files, d.target, d.max_length, set(stop_token_ids(tok)), d.max_samples
        )
        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        torch.manual_seed(t.seed)
        self.out = Path(t.output_dir)
        # resolved once, and held by this process while the trainer lives (trainer/run_lock.py)
        self.out, self.run_lock = prepare_output_dir(
            self.out, t.resume, t.overwrite_output_dir, as_dict(cfg)
        )
        # libraries' logs and warnings: <output_dir>/run.log, as toolgrpo train's
        self.run_log: RunLog | None = RunLog(self.out, t.verbose)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        cfg, t, d = self.cfg, self.cfg.trainer, self.cfg.data
        self.policy = load_policy(cfg.model, trainable=True)
        self.sampler = TaskSampler(
            len(self.examples), min(d.train_batch_size, len(self.examples)), d.seed, d.shuffle
        )
        per_epoch = len(self.examples) // self.sampler.batch_size
        self.total_steps = (
            t.total_training_steps if t.total_training_steps > 0 else per_epoch * t.total_epochs
        )
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(self.policy.model),
            lr=o.lr,
            betas=tuple(o.betas),
            weight_decay=o.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, o.lr_warmup_steps, self.total_steps, o)
        )
        self.step = 0
        found = pick_checkpoint(self.out, t.resume, self._read)
        if found is not None:
            self._load(*found)

    def close(self) -> None:
        """Put the loggers back and let another process write the output directory."""
        if self.run_log is not None:
            self.run_log.close()
            self.run_log = None
        self.run_lock.release()

    def fit(self) -> dict[str, Any]:
        write_text(self.out / "config.yaml", to_yaml(self.cfg))
        logs = f"  (library logs: {self.run_log.path})" if self.run_log else ""
        print(f"outputs: {self.out}{logs}")
        tracker = Tracker(self.out, self.cfg.trainer.logger, self.total_steps, self.step)
        last: dict[str, float] = {}
        try:
            while self.step < self.total_steps:
                self.step += 1
                last = self.train_step()
                tracker.log(last, self.step)  # before saving, as in the GRPO loop
                if self.cfg.trainer.save_freq > 0 and self.step % self.cfg.trainer.save_freq == 0:
                    self._save()
        finally:
            tracker.close()
        return self._finish(last)

    def train_step(self) -> dict[str, float]:
        t0 = time.time()
        self.policy.model.train()
        batch = [self.examples[i] for i in self.sampler.next_batch()]
        total_tokens = sum(sum(e.loss_mask) for e in batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        micro = max(1, self.cfg.data.micro_batch_size_per_gpu)
        for s in range(0, len(batch), micro):
            ids, attn, mask = pad_examples(batch[s : s + micro], self.policy.tokenizer.pad_token_id)
            with self.policy.autocast():
                lp = masked_token_logprobs(self.policy.base, ids, attn, mask)
            loss = -lp.sum() / max(total_tokens, 1)
            loss.backward()
            loss_sum += float(loss.detach())
        norm = clip_grad_norm(trainable_parameters(self.policy.model), self.cfg.trainer.grad_clip)
        if math.isfinite(float(norm)):
            self.optimizer.step()
        self.scheduler.step()
        dt = time.time() - t0
        return {
            "train/loss": loss_sum,
            "train/grad_norm": float(norm),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/tokens": float(sum(len(e.input_ids) for e in batch)),
            "train/target_tokens": float(total_tokens),
            "epoch": float(self.sampler.state.epoch),
            "timing/step_s": dt,
        }

    # ---- checkpoints and final outputs ----------------------------------------------------------
    def _payload(self, d: Path) -> None:
        if self.policy.is_lora:
            self.policy.model.save_pretrained(d / "adapter")
        else:
            save_hf_model(self.policy, d / "model")
        save_torch(
            {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
            d / "optimizer.pt",
        )

    def _save(self) -> Path:
        state = {
            "global_step": self.step,
            "sampler": self.sampler.state_dict(),
            "is_lora": self.policy.is_lora,
            "config": as_dict(self.cfg),
            BASE_KEY: self._base(),
        }
        return write_checkpoint(
            self.out, self.step, state, self._payload, keep=self.cfg.trainer.max_checkpoints
        )

    def _base(self) -> dict[str, str]:
        return base_identity(self.cfg.model.path, self.policy.resolved.hf_dir)

    def _read(self, ckpt: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
        """Every file, checked before anything is applied (a corrupt one falls back)."""
        state = read_state(ckpt)
        weights = read_weights(ckpt, bool(state["is_lora"]))
        opt = load_torch(ckpt / "optimizer.pt")
        if not isinstance(opt, dict) or not {"optimizer", "scheduler"} <= opt.keys():
            raise CorruptCheckpoint(f"{ckpt / 'optimizer.pt'} lacks the optimizer or scheduler")
        return state, weights, opt

    def _load(self, ckpt: Path, saved: tuple[dict[str, Any], dict[str, Any], Any]) -> None:
        state, weights, opt = saved
        step = int(state["global_step"])
        check_base(ckpt, state.get(BASE_KEY), self._base(), "model.path")
        changes = check_resume_config(ckpt, state.get("config"), as_dict(self.cfg), step)
        check_lora(ckpt, state["is_lora"], self.policy)
        apply_weights(self.policy, weights, ckpt)
        load_optimizer(self.optimizer, self.scheduler, opt["optimizer"], opt["scheduler"], ckpt)
        self.sampler.load_state_dict(state["sampler"])
        self.step = step
        announce(ckpt, step, changes)

    def _finish(self, last: dict[str, float]) -> dict[str, Any]:
        final = self.out / ("adapter" if self.policy.is_lora else "model")
        if self.policy.is_lora:
            self.policy.model.save_pretrained(final)
            _name_base(final, self.cfg.model.path)
            record_adapter_base(final, self.cfg.model.path, self.policy.resolved.hf_dir)
        else:
            save_hf_model(self.policy, final)
        result = {
            "output": str(final),
            "steps": self.step,
            "examples": len(self.examples),
            "dropped_too_long": self.dropped,
            "data_hash": data_hash(self.examples),
            "final_loss": last.get("train/loss"),
            "base_model": self.cfg.model.path,
        }
        write_text(self.out / "sft_result.json", json.dumps(result, indent=1))
        return result


def _name_base(adapter_dir: Path, base: str) -> None:
    """Record the base as given (an alias such as ``smollm2-135m``, not a cache path), so the
    adapter directory resolves on any machine."""
    from toolgrpo.models.registry import ALIASES

    if base in ALIASES:
        f = adapter_dir / "adapter_config.json"
        cfg = json.loads(f.read_text())
        cfg["base_model_name_or_path"] = base
        f.write_text(json.dumps(cfg, indent=2))
