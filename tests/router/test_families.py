"""Tool families: the heuristic, RLLA tool blocks of real rows, sidecars, and the map's order."""

from __future__ import annotations

import json
import re

import pytest

from toolgrpo.data.loader import load_tasks
from toolgrpo.router.families import (
    FamilyFileError,
    FamilyMap,
    ToolInfo,
    find_tools_block,
    heuristic_family,
    message_tools,
    read_family_file,
    spec_tools,
)


@pytest.mark.parametrize(
    "name, desc, family",
    [
        ("calculate", "Evaluate an arithmetic expression exactly", "CALCULATE"),
        ("solve", "Solve an equation for one variable", "CALCULATE"),
        ("search", "BM25 search over the document collection", "SEARCH"),
        ("open_document", "Read a whole document by id", "SEARCH"),
        ("GetNews", "Retrieve Azure news articles", "SEARCH"),
        ("std_deviation", "Calculates the standard deviation of a list of numbers.", "CALCULATE"),
        ("QR Code Generator", "Generates a QR code for a given URL", "OTHER"),
    ],
)
def test_heuristic_family(name, desc, family):
    assert heuristic_family(name, desc) == family


def test_every_embedded_rlla_row_has_a_parsable_tools_block():
    for spec in ("rlla:train", "rlla:test"):
        for task in load_tasks([spec]).tasks:
            system = task.messages[0]["content"]
            block = find_tools_block(system)
            assert block is not None
            names = re.findall(r"(?m)^\d+\. Name: (.*)$", system)
            assert [t.name for t in block.tools] == [n.strip() for n in names]
            assert all(t.description for t in block.tools)
            assert system[block.end :].startswith("\n\n**Steps for Each Turn**")


def test_tools_from_specs_and_messages():
    specs = [{"type": "function", "function": {"name": "calculate", "description": "math"}}]
    assert spec_tools(specs) == [ToolInfo("calculate", "math")]
    assert spec_tools([{"name": "bare", "description": ""}, {"nope": 1}]) == [ToolInfo("bare")]
    assert message_tools([{"role": "user", "content": "**Available Tools**"}]) == []


def test_sidecar_reading(tmp_path):
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"GetNews": "search", "calc": "CALCULATE"}))
    assert read_family_file(flat) == {"GetNews": "SEARCH", "calc": "CALCULATE"}
    nested = tmp_path / "labels.json"
    nested.write_text(json.dumps({"tools": {"x": "OTHER"}, "examples": {}}))
    assert read_family_file(nested) == {"x": "OTHER"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"x": "MAGIC"}))
    with pytest.raises(FamilyFileError, match="unknown family"):
        read_family_file(bad)
    with pytest.raises(FamilyFileError, match="cannot read"):
        read_family_file(tmp_path / "missing.json")


def test_map_prefers_overrides_then_known_tools_then_the_name():
    fm = FamilyMap(overrides={"GetNews": "OTHER", "ghost": "SEARCH"})
    fm.add([ToolInfo("GetNews", "Retrieve news"), ToolInfo("Tool A", "Calculates a sum")])
    assert fm.family("GetNews") == "OTHER"
    assert fm.family("Tool A") == "CALCULATE"  # from its description
    assert fm.family("compute_total") == "CALCULATE"  # unseen: its name alone
    assert fm.unknown_overrides() == ["ghost"]
