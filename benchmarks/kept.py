"""What a long benchmark keeps in git so that a later checkout resumes it.

The benchmarks reuse the finished training runs and ``toolgrpo eval`` JSONs of their ``--work``
directory (under ``outputs/``, which git ignores). Beside it they keep, in
``benchmarks/results/<result>_kept/`` (named after the result file), compact copies of what their
summaries read, under the names the work directory uses: each eval JSON without its episodes'
text, small run files (the metrics a summary averages), and the setting the runs were made with.
A piece is looked up in the work directory first, then among the kept copies
(:func:`find`); a kept eval counts as done.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from toolgrpo.safe_io import write_text

# Bulky text fields of an eval sample: an episode's whole conversation, a single-turn sample's
# decoded text. Everything else a sample holds (task_id, reward, tool calls and errors...) stays.
BULKY = ("messages", "response")


def kept_dir(out: Path) -> Path:
    """The kept directory of a benchmark writing ``out`` (``results/x.json``, or ``results/x``
    for its ``.json`` and ``.png``): ``results/x_kept/``, so results of other ``--out`` never
    mix."""
    return out.parent / f"{out.stem}_kept"


def find(work_path: Path, kept_path: Path | None) -> Path | None:
    """The work copy when there is one, else the kept copy, else None."""
    for path in (work_path, kept_path):
        if path is not None and path.is_file():
            return path
    return None


def finder(work: Path, kept: Path | None) -> Callable[[str], Path | None]:
    """``find`` for names relative to both directories (``kept`` None: the work one only)."""
    return lambda name: find(work / name, kept / name if kept is not None else None)


def write_atomic(dest: Path, text: str) -> bool:
    """``text`` into ``dest`` through a temporary file and a rename (``toolgrpo.safe_io``), so
    no reader (nor an interrupted benchmark) sees half a file and a link is refused; nothing is
    written when ``dest`` already holds it. Returns whether it wrote."""
    if dest.is_file() and not dest.is_symlink() and dest.read_text() == text:
        return False
    write_text(dest, text)  # a link at dest, or at a temporary's name, is never written through
    return True


def compact_eval(record: dict[str, Any]) -> dict[str, Any]:
    """An eval record whose samples lack the :data:`BULKY` fields (nothing else changes)."""
    if not isinstance(record.get("samples"), list):
        return dict(record)
    samples = [{k: v for k, v in s.items() if k not in BULKY} for s in record["samples"]]
    return {**record, "samples": samples}


def dump_eval(record: dict[str, Any]) -> str:
    """JSON text with one line per top-level field and per sample (small diffs in git)."""
    items = []
    for key, value in record.items():
        if key == "samples" and isinstance(value, list) and value:
            rows = ",\n".join("  " + json.dumps(s) for s in value)
            items.append(f' "samples": [\n{rows}\n ]')
        else:
            items.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(items) + "\n}\n"


def keep_eval(src: Path, dest: Path) -> bool:
    """Keep the ``toolgrpo eval`` JSON ``src`` as ``dest``, without its samples' text."""
    return write_atomic(dest, dump_eval(compact_eval(json.loads(src.read_text()))))


def keep_file(src: Path, dest: Path, keys: Iterable[str] | None = None) -> bool:
    """Keep ``src`` as ``dest``: as it is or, given ``keys``, a JSON-lines file (metrics.jsonl)
    with every line kept but only those keys (and ``step``) on it."""
    text = src.read_text()
    if keys is not None:
        want = {"step", *keys}
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        text = "".join(json.dumps({k: v for k, v in r.items() if k in want}) + "\n" for r in rows)
    return write_atomic(dest, text)


def keep_machine(where: Path, dest: Path, here: Callable[[], dict[str, Any]]) -> bool:
    """Keep ``where``, the record of the machine a finished run trained on, as ``dest``. A work
    directory is this machine's, so a run there without its record gets ``here()``."""
    if not where.is_file():
        where.write_text(json.dumps(here()) + "\n")
    return keep_file(where, dest)


def training_steps(metrics_jsonl: Path | None) -> list[dict[str, Any]]:
    """A run's metrics.jsonl rows of its training steps (step 0, before training, left out)."""
    if metrics_jsonl is None or not metrics_jsonl.is_file():
        return []
    rows = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("step", 0) > 0]


def step_means(rows: Iterable[dict[str, Any]], keys: Iterable[str]) -> dict[str, float]:
    """Each key's mean over the rows that have it (a key no row has is left out)."""
    rows = list(rows)
    out = {}
    for key in keys:
        vals = [float(r[key]) for r in rows if key in r]
        if vals:
            out[key] = fmean(vals)
    return out


def keep_evals(work: Path, kept: Path, names: Iterable[str]) -> None:
    """Keep every eval of ``names`` that the work directory holds."""
    for name in names:
        if (work / name).is_file():
            keep_eval(work / name, kept / name)


def _same(name: str, a: str, b: str) -> bool:
    return json.loads(a) == json.loads(b) if name.endswith(".json") else a.strip() == b.strip()


def pin(dirs: Sequence[Path], setting: dict[str, str]) -> None:
    """Record a setting (file name -> text) in each of ``dirs`` (a work and a kept directory),
    after checking that none holds another: a directory holds the runs of one setting, and runs
    of another are never reused."""
    for d in dirs:
        for name, text in setting.items():
            path = d / name
            if path.is_file() and not _same(name, path.read_text(), text):
                raise SystemExit(
                    f"{path} holds runs of another setting ({path.read_text().strip()}, not "
                    f"{text.strip()}): use another --work, and another --out for the kept copies"
                )
    for d in dirs:
        for name, text in setting.items():
            write_atomic(d / name, text)


def setting_digest(config: Path, overrides: Sequence[str]) -> str:
    """The sha256 of a config file as ``key=value`` overrides leave it (its YAML tree, keys
    sorted): a value written in the file or given on the command line is one setting, so a
    config that adopts an override keeps the runs made with it; comments and key order do not
    count. Library defaults are not part of it (a key the file does not set)."""
    from omegaconf import OmegaConf

    tree = OmegaConf.merge(OmegaConf.load(config), OmegaConf.from_dotlist(list(overrides)))
    text = json.dumps(OmegaConf.to_container(tree), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def pin_setting(dirs: Sequence[Path], config: Path, overrides: Sequence[str]) -> None:
    """:func:`pin` the setting of ``config`` + ``overrides`` (``setting.sha256``) in ``dirs``,
    and record the overrides (``overrides.json``) where none are recorded. A directory from
    before the setting's hash (``config.sha256``, the file's bytes, and ``overrides.json``) is
    checked the old way, then given the new hash."""
    digest = setting_digest(config, overrides)
    file_digest = hashlib.sha256(config.read_bytes()).hexdigest()
    for d in dirs:
        legacy = d / "config.sha256"
        if legacy.is_file() and not (d / "setting.sha256").is_file():
            pin(
                [d],
                {
                    "config.sha256": file_digest + "\n",
                    "overrides.json": json.dumps(list(overrides)),
                },
            )
            write_atomic(d / "setting.sha256", digest + "\n")
            legacy.unlink()
    pin(dirs, {"setting.sha256": digest + "\n"})
    for d in dirs:
        if not (d / "overrides.json").is_file():
            write_atomic(d / "overrides.json", json.dumps(list(overrides)))
