"""``toolgrpo sft`` configuration (same vocabulary as training where the meaning is the same)."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolgrpo.config.schema import ModelConfig, OptimConfig


@dataclass
class SFTDataConfig:
    train_files: list[str] = field(default_factory=lambda: ["rlla:sft"])
    # RLLA-schema rows: "ground_truth" (ToolRL's placeholder thought + calls) or "output_sft"
    # (the distilled R1 thought). Message JSONL rows ({"messages": [...]}, optionally "tools":
    # [specs], rendered as an episode's prompt) train on assistant turns; "agent:sft" is the
    # embedded set of gold multi-turn episodes (scripts/make_agent_sft.py).
    target: str = "ground_truth"
    max_length: int = 1024  # longer examples are dropped (and counted)
    max_samples: int = -1
    train_batch_size: int = 8
    micro_batch_size_per_gpu: int = 2
    shuffle: bool = True
    seed: int = 0


@dataclass
class SFTModelConfig(ModelConfig):
    path: str = "smollm2-135m"
    lora_rank: int = 16
    lora_alpha: int = 32


@dataclass
class SFTOptimConfig(OptimConfig):
    lr: float = 2e-4
    weight_decay: float = 0.0
    lr_warmup_steps: int = 2
    warmup_style: str = "cosine"
    min_lr_ratio: float = 0.1


@dataclass
class SFTTrainerConfig:
    output_dir: str = "outputs/sft"
    total_epochs: int = 1
    total_training_steps: int = -1  # -1 = total_epochs over the data
    save_freq: int = 10
    resume: str = "auto"
    overwrite_output_dir: bool = False  # as trainer.overwrite_output_dir of toolgrpo train
    max_checkpoints: int = 1
    seed: int = 0
    grad_clip: float | None = 1.0  # max grad norm, > 0; null = no clipping
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    num_threads: int = 0
    # Libraries' logs and Python warnings on the console too; they always go to
    # <output_dir>/run.log (TOOLGRPO_LOG_LEVEL=INFO|DEBUG or ``toolgrpo -v`` does the same).
    verbose: bool = False
    # Modules to import first (module names or .py paths), as toolgrpo train's trainer.imports:
    # what registers custom types; the CLI's --import adds to them.
    imports: list[str] = field(default_factory=list)


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
