"""TRL's side of ``vs_trl.py``: runs inside the TRL venv (never imports TRL into toolgrpo's).

    <venv>/bin/python benchmarks/vs_trl_runner.py SPEC.json

SPEC names the model directory, the LoRA (a PEFT adapter directory, or rank/alpha/targets for a
fresh one), the prompts JSONL ``vs_trl.py`` rendered with toolgrpo's code, the GRPOConfig
arguments, the thread count, toolgrpo's ``src`` (for its RLLA reward) and where per-step timings
go (one JSON line per optimizer step: step_s, gen_s, gen_and_score_s, gen/prompt tokens).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing comes from a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_reward(tokenizer, scores: list[float]):
    """TRL reward function scoring with toolgrpo's RLLA reward, on the string toolgrpo scores:
    the prompt text plus the completion decoded with special tokens kept."""
    from toolgrpo.rewards.rlla import compute_score  # stdlib-only module

    def rlla_reward(prompts, completions, completion_ids, ground_truth, trainer_state, **_):
        step = trainer_state.global_step + 1  # toolgrpo numbers steps from 1
        got = [
            compute_score(p + tokenizer.decode(ids, skip_special_tokens=False), gt, step).total
            for p, ids, gt in zip(prompts, completion_ids, ground_truth, strict=True)
        ]
        scores.extend(got)  # the step's mean goes into the timings file
        return got

    return rlla_reward


def load_model(spec: dict):
    """The base model in the compared dtype, with the LoRA applied (trainable)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32  # master weights; bf16 runs autocast (GRPOConfig bf16=True)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=dtype)
    if spec.get("adapter_dir"):
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, spec["adapter_dir"], is_trainable=True)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
        return model, None
    from peft import LoraConfig

    lora = spec["lora"]
    cfg = LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["targets"],
        task_type="CAUSAL_LM",
    )
    return model, cfg


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, spec["repo_src"])
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = [json.loads(x) for x in Path(spec["dataset"]).read_text().splitlines()]
    dataset = Dataset.from_list(rows)
    model, peft_config = load_model(spec)
    out = Path(spec["timings_out"])
    clock: dict[str, float] = {"gen_s": 0.0, "gen_and_score_s": 0.0, "gen": 0.0, "prompt": 0.0}
    scores: list[float] = []

    class TimedGRPOTrainer(GRPOTrainer):
        """Times generation (``_generate``) and generation + scoring, counts tokens."""

        def _generate(self, prompts):
            t0 = time.perf_counter()
            result = super()._generate(prompts)
            clock["gen_s"] += time.perf_counter() - t0
            clock["prompt"] += sum(len(ids) for ids in result[0])
            clock["gen"] += sum(len(ids) for ids in result[1])
            return result

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            result = super()._generate_and_score_completions(inputs)
            clock["gen_and_score_s"] += time.perf_counter() - t0
            return result

    class StepClock(TrainerCallback):
        """One JSON line per optimizer step, from its on_step_begin to its on_step_end."""

        def on_step_begin(self, args, state, control, **kw):
            clock.update(t0=time.perf_counter(), gen_s=0.0, gen_and_score_s=0.0, gen=0, prompt=0)
            scores.clear()

        def on_step_end(self, args, state, control, **kw):
            row = {
                "step": state.global_step,
                "step_s": time.perf_counter() - clock["t0"],
                "gen_s": clock["gen_s"],
                "gen_and_score_s": clock["gen_and_score_s"],
                "gen_tokens": clock["gen"],
                "prompt_tokens": clock["prompt"],
                "reward_mean": sum(scores) / len(scores) if scores else None,
            }
            with out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[make_reward(tokenizer, scores)],
        args=GRPOConfig(**spec["grpo_config"]),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[StepClock()],
    )
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])
