"""The fixed rollout policies: settings resolved by inheritance, tokenizer check, loading, offload.

A fixed policy only generates: it is loaded frozen (``load_policy(..., trainable=False)``, no
optimizer state) and its sampling log-probs, recorded by the generator under the exact
distribution it sampled (temperature and top-k/top-p included), are the IS denominator.

It samples on the actor's backend (``actor_rollout_ref.rollout.name``/``mode``): HF, or vLLM,
where a fixed model on the actor's base model shares the actor's engine (each part of a step
re-pushes its own weights, ``RolloutPart.activate``). Under ``trainer.distributed.backend=ray``
every rollout worker loads the fixed policies too and samples their rows; the driver's
``FixedPolicies`` then holds the pool's generators (``remote``) and loads a fixed model only when
``actor/is_support_gap`` needs it (a top-k/top-p sampler).

A fixed policy may be a training checkpoint (``global_step_N``, its merged ``model/`` or its
``adapter/``); a checkpoint's adapter is refused on a base other than the one it was trained on
(``models/identity.py``), as resume, eval and infer refuse it.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import ModelConfig, TrainConfig
from toolgrpo.mixture.schedule import FIXED
from toolgrpo.models.identity import check_checkpoint_base
from toolgrpo.models.loading import Policy, load_policy, load_tokenizer
from toolgrpo.models.registry import resolve_model
from toolgrpo.rollout.backends import backend_name, make_generator
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.hf import HFGenerator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FixedSpec:
    """One fixed policy as it will run: label in the batch, model, sampling, share, config key."""

    label: str
    model: ModelConfig
    params: SamplingParams
    weight: float
    batch_size: int
    key: str  # where it is configured, for error messages


def _pick(*values: Any) -> Any:
    """The first value that is set (not None, not "")."""
    return next(v for v in values if v is not None and v != "")


def fixed_specs(cfg: TrainConfig) -> list[FixedSpec]:
    """``rollout_only`` and its ``extra_policies``; an unset field of an extra policy takes
    ``rollout_only``'s value, and an unset field there takes the actor rollout's."""
    ro, r = cfg.rollout_only, cfg.actor_rollout_ref.rollout
    dtype = ro.dtype or cfg.actor_rollout_ref.model.dtype
    entries = [("rollout_only", FIXED, ro)] + [
        (f"rollout_only.extra_policies[{i}]", f"{FIXED}_{i + 1}", e)
        for i, e in enumerate(ro.extra_policies)
    ]
    specs = []
    for key, label, e in entries:
        path = _pick(e.model_path, ro.model_path)
        adapter = e.adapter_path if e.model_path else (e.adapter_path or ro.adapter_path)
        params = SamplingParams(
            n=r.n,
            temperature=_pick(e.temperature, ro.temperature, r.temperature),
            top_p=_pick(e.top_p, ro.top_p, r.top_p),
            top_k=_pick(e.top_k, ro.top_k, r.top_k),
            max_new_tokens=cfg.data.max_response_length,
            stop=tuple(r.stop),
        )
        path, adapter = in_checkpoint(path, adapter)
        model = ModelConfig(path=path, dtype=dtype, adapter_path=adapter)
        batch = _pick(ro.generation_batch_size, r.generation_batch_size)
        specs.append(FixedSpec(label, model, params, float(e.weight), batch, key))
    return specs


STATE_FILE = "trainer_state.json"  # what makes a directory a checkpoint (trainer/checkpoint.py)


def in_checkpoint(path: str, adapter: str) -> tuple[str, str]:
    """A checkpoint directory named as ``model_path`` stands for its merged ``model/`` or its
    ``adapter/`` (on the base the adapter names); as ``adapter_path``, for its ``adapter/``."""
    p, a = Path(path), Path(adapter)
    if adapter and (a / STATE_FILE).is_file() and (a / "adapter").is_dir():
        adapter = str(a / "adapter")
    if not adapter and (p / STATE_FILE).is_file():
        for sub in ("model", "adapter"):
            if (p / sub).is_dir():
                return str(p / sub), adapter
    return path, adapter


def check_fixed_base(spec: FixedSpec) -> None:
    """Refuse a checkpoint's adapter on a base other than the one its checkpoint records (one
    line naming both): it would load silently on any base of the same shape. Full weights, and
    adapters outside a checkpoint (an alias's shipped one, a user's own), record no base."""
    m = spec.model
    adapter = Path(m.adapter_path) if m.adapter_path else resolve_model(m.path).adapter_dir
    if adapter is None or not (adapter.parent / STATE_FILE).is_file():
        return
    ckpt = adapter.parent
    base, key = m.path, f"{spec.key}.model_path"
    if not m.adapter_path:  # a bare adapter directory: on the base its config names
        config = adapter / "adapter_config.json"
        base = json.loads(config.read_text())["base_model_name_or_path"]  # resolve_model read it
        key = f"base_model_name_or_path in {config}"
    check_checkpoint_base(ckpt, base, resolve_model(base).hf_dir, key)


def tokenizer_mismatch(a: Any, b: Any) -> str | None:
    """Why two tokenizers cannot share token ids (vocabulary or special tokens), or None."""
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        diff = sorted(set(va.items()) ^ set(vb.items()))[:3]
        return f"vocabularies differ ({len(va)} vs {len(vb)} tokens; e.g. {diff})"
    for name in ("bos_token", "eos_token", "unk_token"):
        if getattr(a, name) != getattr(b, name):
            return f"{name} differs ({getattr(a, name)!r} vs {getattr(b, name)!r})"
    sa = set(a.all_special_tokens) - {a.pad_token}
    sb = set(b.all_special_tokens) - {b.pad_token}
    if sa != sb:
        return f"special tokens differ ({sorted(sa ^ sb)})"
    return None


def _model_key(m: ModelConfig) -> tuple[str, str, str]:
    return (m.path, m.adapter_path, m.dtype)


def check_fixed(specs: Sequence[FixedSpec], tokenizer: Any, actor_path: str) -> None:
    """Before any weights load: every fixed model shares the actor's tokenizer (checked once per
    path), and a checkpoint's adapter sits on the base it was trained on."""
    seen: set[str] = set()
    for s in specs:
        if s.model.path not in seen:
            seen.add(s.model.path)
            _check_tokenizer(s, tokenizer, actor_path)
    for s in {_model_key(s.model): s for s in specs}.values():
        check_fixed_base(s)


def _check_tokenizer(spec: FixedSpec, tokenizer: Any, actor_path: str) -> None:
    try:
        resolved = resolve_model(spec.model.path)
        tok = load_tokenizer(resolved.hf_dir)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise ConfigError(f"{spec.key}.model_path={spec.model.path!r}: {e}") from e
    why = tokenizer_mismatch(tokenizer, tok)
    if why is not None:
        raise ConfigError(
            f"the fixed policy {spec.model.path!r} ({spec.key}.model_path) must share the "
            f"actor's tokenizer ({actor_path!r}): {why}"
        )


class FixedPolicies:
    """Loads each distinct fixed model once (specs that differ only in sampling share it).

    ``offload=True`` keeps no fixed model between steps: a model is loaded when a step's rollout
    needs it and freed by ``release()`` after that rollout, trading load time per use for memory
    (on CPU there is no device memory to offload to).

    ``remote``: a generator per label that samples elsewhere (the Ray pool's workers); no model
    loads here until ``policy()`` asks for one. ``check=False`` skips the tokenizer and base
    checks, for processes whose caller already ran them (the Ray pool, before its workers
    start)."""

    def __init__(
        self,
        specs: list[FixedSpec],
        tokenizer: Any,
        actor_path: str,
        offload: bool = False,
        cfg: TrainConfig | None = None,
        remote: Mapping[str, Any] | None = None,
        check: bool = True,
    ) -> None:
        self.specs = {s.label: s for s in specs}
        self.tokenizer = tokenizer
        self.offload = offload
        self.cfg = cfg  # the actor's rollout backend settings; None = HF
        self._models: dict[tuple[str, str, str], Policy] = {}
        self._engines: dict[tuple[str, str, str], Any] = {}  # vLLM generators per fixed model
        self.remote = dict(remote) if remote is not None else None
        self._announced: set[tuple[str, str, str]] = set()  # models loaded here in Ray mode
        if check:
            check_fixed(specs, tokenizer, actor_path)
        if not offload and self.remote is None:
            for s in specs:
                self._policy(s)

    def _policy(self, spec: FixedSpec) -> Policy:
        key = _model_key(spec.model)
        if key not in self._models:
            if self.remote is not None and key not in self._announced:
                self._announced.add(key)  # Ray mode: the workers sample, the driver measures
                log.info(
                    "loading the fixed policy %s (%s) in the driver for actor/is_support_gap; "
                    "its rollouts run on the Ray workers",
                    spec.model.path,
                    spec.key,
                )
            try:
                self._models[key] = load_policy(spec.model, trainable=False)
            except FileNotFoundError as e:
                raise ConfigError(f"{spec.key}: {e}") from e
        return self._models[key]

    @property
    def backend(self) -> str:
        return backend_name(self.cfg) if self.cfg is not None else "hf"

    def generator(self, label: str) -> Any:
        """The generator of fixed policy ``label`` on the actor's backend (or the remote one)."""
        if self.remote is not None:
            return self.remote[label]
        spec = self.specs[label]
        policy = self._policy(spec)
        on_vllm = self.cfg is not None and backend_name(self.cfg, policy.base.config) == "vllm"
        if not on_vllm:
            return HFGenerator(policy.model, self.tokenizer, policy.dtype, spec.batch_size)
        key = _model_key(spec.model)
        if key not in self._engines:
            assert self.cfg is not None
            self._engines[key] = make_generator(self.cfg, policy)  # the fixed weights, pushed
        return self._engines[key]

    def policy(self, label: str) -> Policy:
        return self._policy(self.specs[label])

    def release(self) -> None:
        """Free the loaded models (and their vLLM generators) when offloading (no-op
        otherwise)."""
        if self.offload and self._models:
            self.close()
            self._models.clear()
            gc.collect()

    def close(self) -> None:
        """Release vLLM engines held for fixed policies (the last user shuts an engine down)."""
        for gen in self._engines.values():
            gen.close()
        self._engines.clear()

    @property
    def loaded(self) -> int:
        return len(self._models)
