"""Loading the policy (full fine-tuning or LoRA) and its tokenizer from a resolved model."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from toolgrpo.config.schema import ModelConfig
from toolgrpo.errors import UserError, one_line
from toolgrpo.models.attention import register as register_attention
from toolgrpo.models.identity import check_adapter_record
from toolgrpo.models.registry import ResolvedModel, resolve_model

log = logging.getLogger(__name__)


class ModelLoadError(UserError):
    """A model directory that exists but cannot be loaded (bad config.json, truncated weights,
    unreadable tokenizer): the message names the directory."""


def _weight_errors() -> tuple[type[BaseException], ...]:
    """What a broken model directory raises from ``from_pretrained`` (not a bug of ours)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # older safetensors keep it in the Rust module only
        return (OSError, ValueError)
    return (OSError, ValueError, SafetensorError)


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def cpu_has_native_bf16() -> bool:
    """True where bf16 matmuls run in hardware (AVX512-BF16 / AMX); elsewhere bf16 is emulated
    and measured 4-5x slower than float32 (AVX2 machines)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))


def compute_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """``auto`` picks bf16 on a GPU and only where a CPU computes it natively."""
    if name == "auto":
        if device is not None and device.type == "cuda":
            return torch.bfloat16
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


@dataclass
class Policy:
    """A causal LM ready for generation and training, plus what produced it."""

    model: Any  # PreTrainedModel or peft.PeftModel
    tokenizer: PreTrainedTokenizerBase
    resolved: ResolvedModel
    dtype: torch.dtype  # autocast compute dtype
    is_lora: bool
    device: torch.device = torch.device("cpu")  # where the weights live (trainer.device)

    @property
    def base(self) -> Any:
        """The underlying ``*ForCausalLM`` (LoRA layers injected in place when is_lora)."""
        return self.model.get_base_model() if self.is_lora else self.model

    def autocast(self) -> Any:
        """Autocast context: bf16 matmuls with float32 master weights, on the weights' device."""
        enabled = self.dtype != torch.float32
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=enabled)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    try:  # the tokenizers library raises plain Exception on a garbled tokenizer.json
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer at {path}: {one_line(e)}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not tok.chat_template:
        raise ModelLoadError(f"tokenizer at {path} has no chat template; prompts need one")
    return tok


def load_policy(
    cfg: ModelConfig,
    trainable: bool = True,
    device: torch.device | str = "cpu",
    empty: bool = False,
) -> Policy:
    """Load ``cfg.path`` onto ``device``; with ``lora_rank > 0`` (or a shipped adapter) wrap it
    with PEFT LoRA. ``empty``: the same modules with every base weight on the meta device and
    nothing of them read (a sharded start fills each rank's shards itself); buffers are
    computed and a shipped adapter is read as usual, both being small."""
    resolved = resolve_model(cfg.path)
    device = torch.device(device)
    dtype = compute_dtype(cfg.dtype, device)
    tokenizer = load_tokenizer(resolved.hf_dir)
    # Trainable weights stay float32 (bf16 cannot hold lr≈1e-6 updates); frozen ones may be bf16.
    full_ft = trainable and cfg.lora_rank == 0 and resolved.adapter_dir is None
    weight_dtype = torch.float32 if (full_ft or dtype == torch.float32) else dtype
    try:
        if empty:
            model = empty_model(resolved.hf_dir, weight_dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                str(resolved.hf_dir), dtype=weight_dtype, attn_implementation=register_attention()
            )
    except _weight_errors() as e:
        raise ModelLoadError(f"cannot load the model at {resolved.hf_dir}: {one_line(e)}") from e
    model.config.use_cache = True
    adapter = Path(cfg.adapter_path) if cfg.adapter_path else resolved.adapter_dir
    is_lora = cfg.lora_rank > 0 or adapter is not None
    if adapter is not None:  # an adapter saved by toolgrpo sft names its base: check it
        check_adapter_record(adapter, cfg.path, resolved.hf_dir, "model.path")
    if is_lora:
        model = _apply_lora(model, cfg, adapter, trainable, empty)
    if trainable and cfg.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if is_lora:
            model.enable_input_require_grads()
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    model = _buffers_to(model, device) if empty else model.to(device)
    return Policy(model, tokenizer, resolved, dtype, is_lora, device)


def empty_model(hf_dir: Path, dtype: torch.dtype) -> Any:
    """``hf_dir``'s architecture with its parameters on the meta device (no memory, no reads)
    and its buffers computed on the CPU (the rotary frequencies are in no weight file)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(hf_dir))
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=register_attention()
        )
    model.tie_weights()  # the context re-creates each registered parameter, untying them
    return model


def _buffers_to(model: Any, device: torch.device) -> Any:
    """Move the buffers only: meta parameters cannot be copied anywhere."""
    for module in model.modules():
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = buf.to(device)
    return model


def _apply_lora(
    model: Any, cfg: ModelConfig, adapter: Path | None, trainable: bool, empty: bool = False
) -> Any:
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter is not None:
        if not (adapter / "adapter_config.json").is_file():
            raise FileNotFoundError(f"LoRA adapter not found: {adapter}")
        try:
            rank = json.loads((adapter / "adapter_config.json").read_text()).get("r")
        except (OSError, ValueError, AttributeError):
            rank = None  # unreadable: PEFT's load below says why, naming the path
        if cfg.lora_rank > 0 and rank is not None and cfg.lora_rank != rank:
            raise ModelLoadError(
                f"lora_rank={cfg.lora_rank} asks for a new adapter, but {cfg.path!r} comes with "
                f"a rank-{rank} LoRA adapter ({adapter}), which is what would train: set "
                f"lora_rank to {rank} (or 0), or start a fresh adapter from the base model"
            )
        try:
            # On an empty base, low_cpu_mem_usage assigns the adapter's tensors instead of
            # copying them into meta ones (a no-op).
            model = PeftModel.from_pretrained(
                model, str(adapter), is_trainable=trainable, low_cpu_mem_usage=empty
            )
        except _weight_errors() as e:
            raise ModelLoadError(f"cannot load the LoRA adapter at {adapter}: {one_line(e)}") from e
    else:
        target: Any = cfg.target_modules
        if target != "all-linear":
            target = [t.strip() for t in target.split(",") if t.strip()]
        lora = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=target,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    # LoRA weights compute in float32 whatever the base dtype is or the adapter was stored in
    # (the shipped adapter is stored in bf16 to stay small).
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    return model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def save_hf_model(policy: Policy, out_dir: Path) -> None:
    """Write a directory ``AutoModelForCausalLM.from_pretrained`` loads (LoRA merged in)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if policy.is_lora:
        import copy

        merged = copy.deepcopy(policy.model).merge_and_unload()
        merged.save_pretrained(out_dir)
        del merged
    else:
        policy.model.save_pretrained(out_dir)
    policy.tokenizer.save_pretrained(out_dir)
