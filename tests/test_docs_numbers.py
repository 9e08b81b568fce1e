"""The README's results table shows only numbers that the JSON it cites holds.

Convention: each row of the table under "## Results" has four cells (claim, measured, machine,
source). The source cell links its JSON under ``benchmarks/results/`` and ends with an HTML
comment naming, in order, the JSON value behind every number the claim and measured cells show:

    <!-- json: pooled/gain; pooled/se; other.json:seeds/0/rlla_diff; arms/x/rate*100 -->

An entry is a JSON pointer (``/`` between keys, list indices as numbers or ``KEY=VALUE`` for the one
element whose ``KEY`` is ``VALUE``, ``~1`` for a ``/`` inside a key) into the row's first linked
JSON, or into ``FILE.json:`` when another JSON the row links holds it, with an optional ``*FACTOR``
(a fraction shown as a percentage: ``*100``). A shown number matches when the JSON value times the
factor rounds to it at the decimals shown. The machine cell names the cores, the instruction set
(AVX512-BF16 or AVX2) and the dtype (bf16 or fp32); where the JSON records them they must agree.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"

NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(\d+(?:,\d{3})*(?:\.\d+)?)(?![\w])")
COMMENT = re.compile(r"<!--\s*json:(.*?)-->")
JSON_LINK = re.compile(r"\]\((benchmarks/results/[^)#\s]+\.json)\)")


def table_rows(markdown: str) -> list[str]:
    """The data rows of the first table under the ``## Results`` heading."""
    section = markdown.split("\n## Results\n", 1)
    if len(section) != 2:
        return []
    rows: list[str] = []
    for line in section[1].splitlines():
        if line.startswith("## "):
            break
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return rows[2:]  # past the header and its |---| line


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def shown_numbers(text: str) -> list[str]:
    """Every number a reader sees in a cell, in order; code spans and link targets are not text."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", " ", text)
    return [sign + digits for sign, digits in NUMBER.findall(text)]


def parse_number(shown: str) -> tuple[float, int]:
    """A shown number's value and its count of decimals."""
    s = shown.replace("−", "-").replace(",", "").lstrip("+")
    decimals = len(s.split(".", 1)[1]) if "." in s else 0
    return float(s), decimals


def resolve(data: object, pointer: str) -> object:
    """The value at a JSON pointer without its leading ``/`` (``~1`` is ``/``, ``~0`` is ``~``)."""
    node = data
    for raw in pointer.split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and "=" in key:  # the element whose field has that value
            field, want = key.split("=", 1)
            found = [x for x in node if isinstance(x, dict) and str(x.get(field)) == want]
            if len(found) != 1:
                raise KeyError(f"{pointer}: {len(found)} elements with {field} = {want!r}")
            node = found[0]
        elif isinstance(node, list):
            node = node[int(key)]
        elif isinstance(node, dict):
            node = node[key]
        else:
            raise KeyError(f"{pointer}: {key!r} under a {type(node).__name__}")
    return node


def parse_entry(entry: str, default_file: str) -> tuple[str, str, float]:
    """``[FILE.json:]POINTER[*FACTOR]`` as (file, pointer, factor)."""
    factor = 1.0
    if "*" in entry:
        entry, raw_factor = entry.rsplit("*", 1)
        factor = float(raw_factor)
    file = default_file
    if ":" in entry and entry.split(":", 1)[0].endswith(".json"):
        file, entry = entry.split(":", 1)
    return file, entry.strip(), factor


def matches(shown: str, value: float) -> bool:
    target, decimals = parse_number(shown)
    return abs(value - target) <= 0.5 * 10**-decimals + 1e-9 * max(1.0, abs(value))


def check_row(row: str, load=lambda name: json.loads((RESULTS / name).read_text())) -> list[str]:
    """What is wrong with one row of the results table (empty when nothing is)."""
    parts = cells(row)
    if len(parts) != 4:
        return [f"expected 4 cells (claim, measured, machine, source), got {len(parts)}: {row}"]
    claim, measured, machine, source = parts
    linked = [Path(p).name for p in JSON_LINK.findall(source)]
    if not linked:
        return [f"no link to a JSON under benchmarks/results/: {claim}"]
    comment = COMMENT.search(source)
    if comment is None:
        return [f"no <!-- json: ... --> comment naming its numbers' keys: {claim}"]
    entries = [e.strip() for e in comment.group(1).split(";") if e.strip()]
    numbers = shown_numbers(claim) + shown_numbers(measured)
    if len(numbers) != len(entries):
        return [
            f"{claim}: shows {len(numbers)} numbers {numbers} but names {len(entries)} JSON keys"
        ]
    problems = []
    for shown, entry in zip(numbers, entries, strict=True):
        file, pointer, factor = parse_entry(entry, linked[0])
        if file not in linked:
            problems.append(f"{claim}: {entry} reads {file}, which the row does not link")
            continue
        try:
            value = float(resolve(load(file), pointer)) * factor
        except (KeyError, IndexError, ValueError, TypeError) as e:
            problems.append(f"{claim}: {file}:{pointer} is not a number in the JSON ({e})")
            continue
        if not matches(shown, value):
            problems.append(f"{claim}: shows {shown} but {file}:{pointer} is {value:.6g}")
    problems += check_machine(claim, machine, load(linked[0]))
    return problems


def recorded_machine(data: dict) -> tuple[list[str] | None, int | None, str | None]:
    """CPU flags, core count and the run's dtype, where the JSON records them."""
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    flags = machine.get("cpu_flags") or machine.get("flags") or data.get("cpu_flags")
    cores = machine.get("cores") or machine.get("cpus") or machine.get("cpu_count")
    dtype = machine.get("dtype")
    overrides = data.get("overrides") if isinstance(data.get("overrides"), list) else []
    if any(str(o).endswith("dtype=float32") for o in overrides):
        dtype = "float32"
    return flags, cores, dtype


def check_machine(claim: str, machine: str, data: dict) -> list[str]:
    problems = []
    cores = re.search(r"(\d+) cores", machine)
    isa = "AVX512-BF16" if "AVX512-BF16" in machine else "AVX2" if "AVX2" in machine else None
    named = {d for d in ("bf16", "fp32") if d in machine}
    if cores is None or isa is None or not named:
        return [f"{claim}: machine cell {machine!r} must name N cores, AVX512-BF16/AVX2, bf16/fp32"]
    flags, n_cores, dtype = recorded_machine(data)
    if flags is not None and (("avx512_bf16" in flags) != (isa == "AVX512-BF16")):
        problems.append(f"{claim}: machine says {isa}, the JSON's CPU flags are {flags}")
    if n_cores is not None and int(cores.group(1)) != int(n_cores):
        problems.append(f"{claim}: machine says {cores.group(1)} cores, the JSON {n_cores}")
    want = {"bfloat16": "bf16", "float32": "fp32"}.get(str(dtype))
    if want is not None and want not in named:
        problems.append(f"{claim}: machine names {sorted(named)}, the JSON's dtype is {dtype}")
    return problems


def test_readme_results_table_matches_its_json():
    rows = table_rows(README.read_text())
    assert len(rows) >= 5, "README.md has no results table under '## Results'"
    problems = [p for row in rows for p in check_row(row)]
    assert not problems, "\n".join(problems)


# ---- the checker itself fails on drift ----------------------------------------------------------

DATA = {
    "pooled": {"gain": 7.111, "se": 1.74},
    "arms": {"a/b": {"rate": 0.0422}},
    "runs": [{"arm": "x", "acc": 0.1}, {"arm": "y", "acc": 0.2}],
    "machine": {"cpu_flags": ["avx2", "avx512_bf16"], "cores": 2, "dtype": "bfloat16"},
}
ROW = (
    "| it learns | +{gain} ± 1.7 points; errors {rate} % | 2 cores, AVX512-BF16, bf16 | "
    "[x](benchmarks/results/x.json) <!-- json: pooled/gain; pooled/se; arms/a~1b/rate*100 --> |"
)


def _check(row: str, data: dict = DATA) -> list[str]:
    return check_row(row, load=lambda name: data)


def test_checker_accepts_numbers_that_round_from_the_json():
    assert _check(ROW.format(gain="7.1", rate="4.2")) == []


@pytest.mark.parametrize(
    "gain,rate", [("7.2", "4.2"), ("−7.1", "4.2"), ("7.1", "4.3"), ("7.12", "4.2")]
)
def test_checker_fails_on_a_drifted_number(gain, rate):
    assert _check(ROW.format(gain=gain, rate=rate))


def test_checker_fails_on_an_unnamed_number():
    row = ROW.format(gain="7.1", rate="4.2").replace("points;", "points over 16 steps;")
    assert "names 3 JSON keys" in _check(row)[0]


def test_checker_fails_on_a_wrong_machine():
    row = ROW.format(gain="7.1", rate="4.2")
    assert _check(row.replace("AVX512-BF16, bf16", "AVX2, fp32"))
    assert _check(row.replace("2 cores", "4 cores"))


def test_numbers_in_words_code_and_links_are_not_shown_numbers():
    text = "AVX2 `kl_loss_coef=0.1` [main job](docs/x.md#step-16) −0.08 and 1,200 tasks, z 4.1."
    assert shown_numbers(text) == ["−0.08", "1,200", "4.1"]


def test_a_list_element_is_found_by_a_field_and_must_be_the_only_one():
    assert resolve(DATA, "runs/arm=y/acc") == 0.2
    assert resolve(DATA, "runs/1/acc") == 0.2
    with pytest.raises(KeyError, match="0 elements"):
        resolve(DATA, "runs/arm=z/acc")
    twice = {"runs": [{"arm": "x"}, {"arm": "x"}]}
    with pytest.raises(KeyError, match="2 elements"):
        resolve(twice, "runs/arm=x")
