"""SFT: assistant-only loss masks (checked by decoding), the held-out test split, and tiny runs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import read_metrics, rlla_row, write_jsonl
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import ModelConfig
from toolgrpo.data.loader import DataError, embedded_path
from toolgrpo.models.loading import load_policy, load_tokenizer
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.sft.config import SFTConfig
from toolgrpo.sft.data import build_examples, tokenize_conversation
from toolgrpo.sft.trainer import SFTTrainer

ANSWER = '<think> x </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def end_ids(tok):
    return set(stop_token_ids(tok))


def _masked_text(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)


def _spans(mask):
    spans, start = [], None
    for k, m in enumerate([*mask, 0]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            spans.append((start, k))
            start = None
    return spans


def test_mask_covers_exactly_the_assistant_turn(tok, end_ids):
    msgs = [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "call f please"},
        {"role": "assistant", "content": ANSWER},
    ]
    ids, mask = tokenize_conversation(tok, msgs, end_ids)
    assert len(ids) == len(mask)
    assert set(mask) == {0, 1}
    assert _masked_text(tok, ids, mask) == ANSWER + "<|im_end|>"
    assert len(_spans(mask)) == 1
    # everything before the span is the prompt with its generation header
    start = mask.index(1)
    prompt = tok.decode(ids[:start], skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "call f please" in prompt
    # the template's trailing newline after <|im_end|> is not trained on
    assert tok.decode(ids[mask.index(1) :][sum(mask) :], skip_special_tokens=False) == "\n"


def test_two_assistant_turns_are_both_masked(tok, end_ids):
    msgs = [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "<response> done </response>"},
    ]
    ids, mask = tokenize_conversation(tok, msgs, end_ids)
    spans = _spans(mask)
    assert len(spans) == 2
    texts = [tok.decode(ids[a:b], skip_special_tokens=False) for a, b in spans]
    assert texts == [ANSWER + "<|im_end|>", "<response> done </response><|im_end|>"]
    unmasked = tok.decode(
        [i for i, m in zip(ids, mask, strict=True) if not m], skip_special_tokens=False
    )
    assert "first" in unmasked and "second" in unmasked
    assert "<response>" not in unmasked and "tool_call" not in unmasked


def test_conversation_without_assistant_is_refused(tok, end_ids):
    with pytest.raises(ValueError, match="no assistant"):
        tokenize_conversation(tok, [{"role": "user", "content": "hi"}], end_ids)


def test_build_examples_refuses_embedded_test_split(tok, end_ids):
    with pytest.raises(DataError, match="held-out"):
        build_examples(tok, ["rlla:test"], "ground_truth", 4096, end_ids)


def _first_test_row() -> dict:
    with embedded_path("rlla_4k_test.jsonl").open() as fh:
        return json.loads(fh.readline())


def test_build_examples_refuses_a_test_row_in_a_file(tok, end_ids, tmp_path):
    path = write_jsonl(tmp_path / "leaky.jsonl", [rlla_row(0), _first_test_row(), rlla_row(2)])
    with pytest.raises(DataError) as ei:
        build_examples(tok, [str(path)], "ground_truth", 10**6, end_ids)
    assert "held-out" in str(ei.value)
    assert str(path) in str(ei.value)


def test_build_examples_refuses_a_test_row_in_messages_format(tok, end_ids, tmp_path):
    row = _first_test_row()
    conv = {"messages": [*row["prompt"], {"role": "assistant", "content": "ok"}]}
    path = write_jsonl(tmp_path / "msgs.jsonl", [conv])
    with pytest.raises(DataError, match="held-out"):
        build_examples(tok, [str(path)], "ground_truth", 10**6, end_ids)


def test_build_examples_from_rows_and_messages(tok, end_ids, tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", [rlla_row(i) for i in range(3)])
    conv = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<response> hello </response>"},
        ]
    }
    msgs = write_jsonl(tmp_path / "m.jsonl", [conv])
    examples, dropped = build_examples(tok, [str(rows), str(msgs)], "ground_truth", 4096, end_ids)
    assert dropped == 0 and len(examples) == 4
    assert _masked_text(tok, examples[0].input_ids, examples[0].loss_mask).startswith("<think> x")
    assert _masked_text(tok, examples[3].input_ids, examples[3].loss_mask) == (
        "<response> hello </response><|im_end|>"
    )
    # too-long examples are dropped and counted; nothing fitting is an error
    short, dropped = build_examples(tok, [str(rows), str(msgs)], "ground_truth", 40, end_ids)
    assert dropped == 3 and len(short) == 1
    with pytest.raises(DataError, match="max_length"):
        build_examples(tok, [str(rows)], "ground_truth", 5, end_ids)
    with pytest.raises(DataError, match="no SFT output"):
        build_examples(tok, [str(rows)], "output_sft", 4096, end_ids)


def _sft_config(tiny_model_dir, data, out, steps, *extra):
    return load_config(
        SFTConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            "model.dtype=float32",
            f"data.train_files=[{data}]",
            "data.max_length=4096",
            "data.train_batch_size=2",
            f"trainer.total_training_steps={steps}",
            "trainer.logger=[jsonl]",
            f"trainer.output_dir={out}",
            *extra,
        ],
    )


def test_two_step_sft_run_writes_adapter(tiny_model_dir, tiny_data, tmp_path):
    out = tmp_path / "sft"
    result = SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 2)).fit()
    assert result["steps"] == 2
    assert result["examples"] == 8
    assert result["output"] == str(out / "adapter")
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert json.loads((out / "sft_result.json").read_text()) == result
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["train/loss"] > 0 and r["train/target_tokens"] > 0 for r in recs)
    # The adapter loads back onto the base (directly, or as a bare adapter dir).
    for cfg in (
        ModelConfig(path=str(tiny_model_dir), dtype="float32", adapter_path=str(out / "adapter")),
        ModelConfig(path=str(out / "adapter"), dtype="float32"),
    ):
        assert load_policy(cfg, trainable=False).is_lora


def test_sft_loss_decreases_on_a_repeated_example(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "one.jsonl", [rlla_row(0)])
    out = tmp_path / "overfit"
    SFTTrainer(
        _sft_config(
            tiny_model_dir,
            data,
            out,
            5,
            "optim.lr=1e-2",
            "optim.lr_warmup_steps=0",
            "optim.warmup_style=constant",
        )
    ).fit()
    losses = [r["train/loss"] for r in read_metrics(out)]
    assert len(losses) == 5
    # Adam at lr 1e-2 overshoots once on the tiny model (not monotone), but clearly learns.
    assert losses[-1] < losses[0] - 0.1, losses
    assert min(losses[1:]) < losses[0]


def test_sft_full_finetune_writes_model(tiny_model_dir, tiny_data, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "full"
    result = SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 1, "model.lora_rank=0")).fit()
    assert result["output"] == str(out / "model")
    AutoModelForCausalLM.from_pretrained(str(out / "model"))


def test_sft_resume_continues_from_checkpoint(tiny_model_dir, tiny_data, tmp_path):
    out = tmp_path / "resume"
    first = SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 2, "trainer.save_freq=1"))
    first.fit()
    assert (out / "checkpoints" / "global_step_2" / "adapter").is_dir()
    second = SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 4, "trainer.save_freq=1"))
    assert second.step == 2
    assert second.sampler.state_dict() == first.sampler.state_dict()
    result = second.fit()
    assert result["steps"] == 4
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]


class _Killed(BaseException):
    pass


def test_sft_kill_between_checkpoint_and_log_keeps_every_step(
    tiny_model_dir, tiny_data, tmp_path, monkeypatch
):
    out = tmp_path / "gap"
    trainer = SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 3, "trainer.save_freq=1"))
    orig = SFTTrainer._save

    def save_then_die(self):
        path = orig(self)
        if self.step == 2:
            raise _Killed()
        return path

    monkeypatch.setattr(SFTTrainer, "_save", save_then_die)
    with pytest.raises(_Killed):
        trainer.fit()
    monkeypatch.setattr(SFTTrainer, "_save", orig)
    SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 3, "trainer.save_freq=1")).fit()
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]


@pytest.mark.parametrize(
    "messages",
    [
        [{"content": "hi"}, {"role": "assistant", "content": "ok"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant"}],
    ],
)
def test_malformed_message_rows_are_a_data_error(tok, end_ids, tmp_path, messages):
    path = write_jsonl(tmp_path / "bad_msgs.jsonl", [{"messages": messages}])
    with pytest.raises(DataError, match="row 0"):
        build_examples(tok, [str(path)], "ground_truth", 4096, end_ids)
