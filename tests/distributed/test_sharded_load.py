"""Sharded start under FSDP2: each rank fills its shards from the safetensors files.

Before it, every rank loaded the whole model (rank 0 twice) and ``toolgrpo.distributed.
sharded_load`` did not exist, so each of these tests failed at import.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed import free_port
from toolgrpo.config.schema import ModelConfig

MODES = ["full", "lora", "adapter_bf16", "split_files"]


def _model_cfg(model_dir: Path, mode: str, adapter: Path | None) -> ModelConfig:
    """full: fp32 full fine-tuning (tied embeddings); lora: a fresh rank-4 adapter (random
    init, in no file); adapter_bf16: a frozen bf16 base under a shipped fp32 adapter (the
    reference model of a run that starts from an adapter); split_files: full fine-tuning from
    weights split over two files by an index, beside a stray file the index does not name."""
    if mode in ("full", "split_files"):
        return ModelConfig(path=str(model_dir), dtype="float32")
    if mode == "lora":
        return ModelConfig(path=str(model_dir), dtype="float32", lora_rank=4)
    return ModelConfig(path=str(model_dir), dtype="bfloat16", adapter_path=str(adapter))


def _rank(rank: int, world: int, port: int, args: tuple, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    from toolgrpo.distributed.fsdp import Ranks, full_tensors, leave_process_group
    from toolgrpo.distributed.sharded_load import (
        actor_policy,
        checkpoint_key,
        shard_from_files,
        start_policy,
    )

    dist.init_process_group("gloo")
    try:
        mode, every_rank_samples = args[1], args[3]
        m = _model_cfg(*args[:3])
        ranks = Ranks(rank, world, True, torch.device("cpu"), every_rank_samples)
        torch.manual_seed(0)  # a fresh adapter's init, as in the full load
        policy = start_policy(m, ranks, trainable=mode != "adapter_bf16")
        given = actor_policy(policy, ranks)  # a sampling rank: a meta copy of its rollout copy

        def meta(model) -> bool:
            return all(p.is_meta for n, p in model.named_parameters() if checkpoint_key(n))

        started_empty, given_empty = meta(policy.model), meta(given.model)  # before sharding
        root, stats = shard_from_files(given.model, given.resolved.hf_dir, ranks)
        full = {n.removeprefix("lm."): t.clone() for n, t in full_tensors(root, False)}
        result = {
            "full": full,
            "buffers": {n.removeprefix("lm."): b.clone() for n, b in root.named_buffers()},
            "started_empty": started_empty,
            "actor_given_empty": given_empty,
            "bytes_read": stats.bytes_read,
            "file_bytes": stats.file_bytes,
        }
        torch.save(result, f"{out}.{rank}")
    finally:
        leave_process_group()


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A rank-4 LoRA adapter of the tiny model, its B non-zero so it changes the outputs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
    out = tmp_path_factory.mktemp("adapter") / "a"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def split_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with its weights in two files named by an index, and a stray file of
    zeros under the same keys that only a reader ignoring the index would use."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("split") / "m"
    shutil.copytree(tiny_model_dir, d)
    (single,) = d.glob("*.safetensors")
    sd = load_file(single)
    single.unlink()
    keys = sorted(sd)
    parts = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    for name, ks in parts.items():
        save_file({k: sd[k] for k in ks}, d / name, metadata={"format": "pt"})
    weight_map = {k: name for name, ks in parts.items() for k in ks}
    index = {"metadata": {}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    stray = {k: torch.zeros_like(v) for k, v in sd.items()}
    save_file(stray, d / "consolidated.safetensors", metadata={"format": "pt"})
    return d


@pytest.mark.parametrize(
    ("mode", "sampling"), [*((m, "main") for m in MODES), ("full", "all"), ("lora", "all")]
)
def test_sharded_start_equals_full_load(
    tiny_model_dir, adapter_dir, split_dir, tmp_path, mode, sampling
):
    """2 gloo ranks: the shards filled from the files, gathered, are bitwise the parameters and
    buffers (rotary frequencies) of the plain full load, for full fine-tuning with tied
    embeddings, a fresh LoRA, a bf16 base under a shipped adapter, and weights split over
    files by an index. A rank that samples (every rank by default, rank 0 alone with
    ``rollout_ranks=main``) keeps its whole rollout copy but gives the actor an empty one; a
    rank that does not starts with no weights at all. The two ranks' reads add up to the files,
    each byte read once."""
    from toolgrpo.models.loading import load_policy

    every = sampling == "all"
    args = (split_dir if mode == "split_files" else tiny_model_dir, mode, adapter_dir, every)
    torch.manual_seed(0)
    want = load_policy(_model_cfg(*args[:3]), trainable=mode != "adapter_bf16").model
    out = str(tmp_path / "rank")
    mp.spawn(_rank, args=(2, free_port(), args, out), nprocs=2, join=True)
    got = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    names = dict(want.named_parameters())
    for g in got:
        assert set(g["full"]) == set(names)
        for n, p in names.items():
            assert g["full"][n].dtype == p.dtype, n
            assert torch.equal(g["full"][n], p.detach()), n
        buffers = dict(want.named_buffers())
        assert set(g["buffers"]) == set(buffers)
        for n, b in buffers.items():
            assert torch.equal(g["buffers"][n], b), n
    assert [g["started_empty"] for g in got] == [False, not every]
    assert [g["actor_given_empty"] for g in got] == [True, True]
    total = got[0]["file_bytes"]
    assert got[0]["bytes_read"] + got[1]["bytes_read"] == total
    assert all(0 < g["bytes_read"] <= total * 0.55 for g in got)  # ceil(n/2) rows of each


def test_files_without_safetensors_fall_back_to_the_full_load(tiny_model_dir, tmp_path, caplog):
    """A model directory without safetensors cannot be read by rows: every rank loads the
    whole model, as before, and the reason is logged once."""
    import shutil

    from transformers import AutoModelForCausalLM

    from toolgrpo.distributed.fsdp import Ranks
    from toolgrpo.distributed.sharded_load import blocker, start_policy

    d = tmp_path / "bin_model"
    shutil.copytree(tiny_model_dir, d)
    sd = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    torch.save(sd, d / "pytorch_model.bin")
    for f in d.glob("*.safetensors"):
        f.unlink()
    assert blocker(str(d)) == f"no *.safetensors in {d}"
    ranks = Ranks(1, 2, True, torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger="toolgrpo.distributed.sharded_load"):
        p = start_policy(ModelConfig(path=str(d), dtype="float32"), ranks)
        start_policy(ModelConfig(path=str(d), dtype="float32"), ranks, trainable=False)
    assert not any(t.is_meta for t in p.model.parameters())
    assert [r.getMessage() for r in caplog.records].count(
        f"FSDP2 start loads the whole model on every rank: no *.safetensors in {d}"
    ) == 1
    assert blocker(str(tiny_model_dir)) is None
