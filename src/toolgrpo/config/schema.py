"""Typed configuration, keyed with verl's vocabulary so a verl user's overrides carry over.

Defaults here are the one source of truth: YAML files only override them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolgrpo.config.algorithm import (  # noqa: F401
    AlgorithmConfig,
    FilterGroupsConfig,
    KLCtrlConfig,
    RolloutCorrectionConfig,
)
from toolgrpo.config.mixture import (  # noqa: F401
    FixedPolicyConfig,
    RolloutAllocationScheduleConfig,
    RolloutOnlyConfig,
)
from toolgrpo.config.router import RouterConfig


@dataclass
class DataConfig:
    # "rlla:train" / "rlla:test" / "rlla:sft" name the embedded RLLA rows; anything else is a path.
    train_files: list[str] = field(default_factory=lambda: ["rlla:train"])
    val_files: list[str] = field(default_factory=lambda: ["rlla:test"])
    train_batch_size: int = 4  # prompts per step; each yields actor_rollout_ref.rollout.n samples
    val_batch_size: int = 16
    max_prompt_length: int = 1024
    max_response_length: int = 192
    truncation: str = "left"  # "left" | "error": what to do with prompts over max_prompt_length
    filter_overlong_prompts: bool = True  # drop tasks whose opening (env, route) is too long
    shuffle: bool = True
    seed: int | None = None  # task order; None = trainer.seed
    bad_rows: str = "skip"  # "skip" reports and drops malformed rows; "error" refuses the file
    max_samples: int = -1  # first N rows, round-robin over the files; -1 = all rows
    val_max_samples: int = -1  # in-training validation: first N val tasks, round-robin over files


@dataclass
class ModelConfig:
    path: str = "smollm2-135m-agent"  # HF dir, .gguf file, or alias (see toolgrpo.models.registry)
    dtype: str = "auto"  # compute dtype: auto = bf16 where the CPU has it natively, else fp32
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    target_modules: str = "all-linear"
    adapter_path: str = ""  # start from an existing LoRA adapter
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_warmup_steps: int = 0
    warmup_style: str = "constant"  # "constant" | "cosine"
    min_lr_ratio: float = 0.0


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    ppo_mini_batch_size: int = 4  # prompts per optimizer step (verl semantics: before ×n)
    ppo_micro_batch_size_per_gpu: int = 4  # sequences per forward/backward
    ppo_epochs: int = 1
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None  # None -> clip_ratio
    clip_ratio_high: float | None = None  # None -> clip_ratio
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    grad_clip: float | None = 1.0  # max grad norm, > 0; null = no clipping (norm still logged)
    logprob_chunk_size: int = 64  # response positions per lm_head chunk: bounds the [B, T, V] peak
    # torch.compile norms, MLPs, LoRA projections and the LM head's statistics
    # (toolgrpo.models.compiled): faster updates after tens of seconds of compile; not with fsdp2
    use_torch_compile: bool = False


@dataclass
class ValKwargs:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    do_sample: bool = False


# Searched in tool output that is not flagged as an error, so only what no success prints: a
# Python traceback, or output that opens with an exception line ("ZeroDivisionError: ...").
# Not "Error ..." anywhere (a search hit titled "Error correction codes" is a success).
ROLLBACK_ERROR_PATTERNS = (
    r'(?m)^Traceback \(most recent call last\):\r?\n\s+File "',
    r"\A\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception):(?:\s|$)",
)
# Output that parses as a JSON object (or a list of them) whose field of one of these names holds
# a non-empty value fails: BFCL's simulators reply {"error": "cd: ...: No such directory"};
# {"error": null, "value": 42} is a success.
ROLLBACK_ERROR_JSON_KEYS = ("error",)
# Flagged errors that the model caused; timeouts may be the machine's, transport errors end the
# episode anyway.
ROLLBACK_ERROR_TYPES = ("parse", "unknown_tool", "invalid_arguments", "exception")
ROLLBACK_MODES = ("retry", "fission", "relabel")  # docs/multi_turn.md, "Tool-call rollback"
# How the model writes tool calls (toolgrpo.rollout.tool_parsers; docs/multi_turn.md): the
# built-in formats; a user's module may register more (``register_tool_format``).
TOOL_CALL_FORMATS = ("hermes", "llama3_json", "mistral")


@dataclass
class SchemaAugmentationConfig:
    """Training episodes offer their tools under drawn names, argument names and orders
    (``toolgrpo.envs.schema_augment``); validation and eval keep the tools' own names."""

    enable: bool = False
    prob: float = 0.5  # share of training tasks (a task's whole group alike) renamed
    task_types: list[str] = field(default_factory=list)  # [] = every task type with tools


@dataclass
class MultiTurnConfig:
    """Episodes with tool calls (``toolgrpo.rollout.multi_turn``). ``data.max_response_length``
    then bounds the whole episode after the prompt: every turn plus the tool results."""

    enable: bool = False
    # verl's key: the tool-call parser and calling instructions, per model family
    format: str = "hermes"  # hermes | llama3_json | mistral | a registered format's name
    max_tokens_per_turn: int = 256  # one assistant turn
    max_tool_response_length: int = 256  # tokens of one tool result (0 = no limit)
    tool_response_truncate_side: str = "middle"  # right (keep head) | left (keep tail) | middle
    max_concurrent_episodes: int = 0  # episodes in flight at once; 0 = all of a step's
    # An episode whose environment failed (constructor/reset/step/reward raised, transport error,
    # the environment's own timeout) is dropped from training and from reward means; this is only
    # the score recorded on it (kept for compatibility).
    error_reward: float = -1.0
    # The run stops (EnvFailureError) when more than this share of a step's episodes failed in
    # their environment; 1.0 never stops (a step whose episodes all failed skips its update).
    max_env_failure_ratio: float = 0.5
    # Deadlines on environment calls (reset, step, next_user_turn, reward, snapshot/restore,
    # close): one call, and all of one episode's calls together (generation not counted). Past
    # either, the episode is an environment failure with the reason; 0 = no limit.
    env_call_timeout_s: float = 60.0
    env_episode_timeout_s: float = 900.0
    # DAPO's overlong filtering: truncated episodes (context, length, max_turns, prompt_too_long)
    # stay in their group's baseline but train no token; rollout/truncated_frac is their share.
    mask_truncated: bool = False
    # task_type -> {type: <env type, default the task type>, max_turns: N, <env options>...}
    envs: dict[str, Any] = field(default_factory=dict)
    schema_augmentation: SchemaAugmentationConfig = field(default_factory=SchemaAugmentationConfig)
    # Tool rollback (toolgrpo.rollout.rollback): a turn whose tool results match is undone and
    # sampled again (retry), or kept and gone on from with the failing turn trained only as a
    # negative (relabel); no failed attempt goes untrained. fission (Fission-GRPO,
    # toolgrpo.rollout.fission) instead forks an episode's first failure into a group of
    # continuations sampled from its error feedback, trained as their own GRPO group.
    enable_tool_rollback: bool = False
    rollback_mode: str = "retry"  # retry | fission | relabel (relabel needs no snapshots)
    max_tool_retries: int = 2  # re-samplings (relabels) of one failing turn; then it stands
    fission_group_size: int = 4  # fission: continuations sampled from one failed call
    max_fission_forks_per_step: int | None = 8  # fission: fork groups a step adds; null = no cap
    save_negative_samples: bool = True  # false erases retried failures: their calls go untrained
    max_negative_samples_per_group: int | None = None  # over a task's n episodes; null = no cap
    # The score of a negative sample; at most every environment's lowest reward (checked at
    # startup against Env.reward_range). Its advantage is never positive (algos.advantages).
    negative_reward: float = -1.0
    # A failed turn: a result flagged as an error of one of these types (tools.types.ERROR_TYPES),
    # or an ordinary result whose text matches one of these regexes (re.search).
    rollback_error_patterns: list[str] = field(
        default_factory=lambda: list(ROLLBACK_ERROR_PATTERNS)
    )
    rollback_error_types: list[str] = field(default_factory=lambda: list(ROLLBACK_ERROR_TYPES))
    # ... or whose JSON carries a non-empty value under one of these keys ([] = off)
    rollback_error_json_keys: list[str] = field(
        default_factory=lambda: list(ROLLBACK_ERROR_JSON_KEYS)
    )


@dataclass
class RolloutConfig:
    # hf | vllm | auto: vLLM when it imports and serves the model here (on CPU: its head size),
    # else HF; the choice and its reason are printed once at startup
    name: str = "auto"
    # sync: one generate call per wave of episode turns | async: vLLM's async engine, each turn
    # its own request, continuously batched (multi-turn; name=vllm or auto)
    mode: str = "sync"
    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off, as in verl/vLLM
    # Strings that end a turn when sampled (vLLM's ``stop``; kept in the output), e.g.
    # ["</tool_call>"]; stop tokens (EOS, <|im_end|>) always end one.
    stop: list[str] = field(default_factory=list)
    log_prob_micro_batch_size_per_gpu: int = 8
    generation_batch_size: int = 16  # sequences per generate() call
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    # vLLM engine (rollout.name=vllm; toolgrpo.rollout.vllm_backend), verl's key names.
    dtype: str = (
        "auto"  # auto: bf16 on GPU or AVX512-BF16 CPUs, fp32 otherwise | bfloat16 | float32
    )
    enforce_eager: bool = True  # no CUDA graphs / torch.compile: fast start, small models
    gpu_memory_utilization: float = 0.5  # GPU only; on CPU the KV cache is cpu_kvcache_space_gb
    cpu_kvcache_space_gb: float = 1.0  # CPU KV cache; VLLM_CPU_KVCACHE_SPACE, if set, wins
    max_num_seqs: int = 64
    max_model_len: int = 0  # 0 = data.max_prompt_length + data.max_response_length
    tensor_model_parallel_size: int = 1
    enable_prefix_caching: bool = True


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 8


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


@dataclass
class CriticConfig:
    """Value head on the actor's final hidden state; used only when adv_estimator=gae."""

    vf_coef: float = 0.5
    cliprange_value: float = 0.5
    lr: float = 1e-5


@dataclass
class RllaRewardConfig:
    # None = read the ToolRL environment variable of the same name (only "1" turns it on).
    withlength: bool | None = None
    schedulelength: bool | None = None
    correctmax1: bool | None = None
    max1step30max3: bool | None = None
    schedulereward: bool | None = None
    refinedreward: bool | None = None
    intermediatereward: bool | None = None
    coarsereward: bool | None = None


@dataclass
class RewardConfig:
    rlla: RllaRewardConfig = field(default_factory=RllaRewardConfig)
    nan_policy: str = (
        "error"  # "error" stops with the offending sample; "zero" scores it 0 and counts it
    )
    # A price per tool call in the reward the LM trains on: each rollout scores r − this × its
    # calls (every <tool_call> block it wrote); logged rewards stay r. With no router head this
    # is OTC's setting (arXiv 2504.14870): the LM learns alone when a call is worth its price.
    # 0 = off; refused with router.enable (λ prices calls there) and dynamic sampling.
    tool_call_cost: float = 0.0


@dataclass
class DistributedConfig:
    """Where rollouts run (``toolgrpo.distributed``): in the trainer's process, or on Ray actors
    that each hold a generator and the environments and receive versioned weights."""

    backend: str = "local"  # local | ray
    num_rollout_workers: int = 2
    address: str = ""  # ray.init(address=...): "" starts a local cluster, "auto" joins one
    num_cpus_per_worker: float = 1.0
    call_timeout_s: float = 900.0  # every remote call; a worker over it is restarted
    max_worker_restarts: int = 3  # per run; then the run stops with the worker's error
    # The update: "none" = one process; "fsdp2" = data-parallel FSDP2 over the torchrun ranks
    # (gloo on CPU, nccl on GPU; docs/scale_out.md).
    strategy: str = "none"
    # Who samples under fsdp2: "all" = every rank its share of the step's prompt groups, each
    # with its own rollout copy; "main" = rank 0 alone; "auto" = all with the local backend,
    # rank 0's Ray pool with backend=ray.
    rollout_ranks: str = "auto"
    ray_init_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {num_cpus: 2}


@dataclass
class TrainerConfig:
    project_name: str = "toolgrpo"
    experiment_name: str = "grpo"
    output_dir: str = "outputs/run"
    total_training_steps: int = 10
    total_epochs: int = 100  # an upper bound; total_training_steps usually ends the run first
    save_freq: int = 5  # -1 = only at the end
    test_freq: int = -1  # -1 = never during training
    val_before_train: bool = False
    resume: str = "auto"  # "auto" | "disable" | a checkpoint directory
    # An output_dir holding another run is refused; true moves it aside to <dir>.old-<UTC time>
    # (never deleted) and starts fresh, as Hugging Face Trainer's key of the same name.
    overwrite_output_dir: bool = False
    max_checkpoints: int = 2
    seed: int = 0
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    num_threads: int = 0  # 0 = torch default
    save_hf_model: bool = True  # write a from_pretrained-loadable model into each checkpoint
    # Warn when this many steps in a row carry no learning signal (every reward non-finite, or
    # every group's scores all equal); 0 = never.
    warn_no_signal_steps: int = 3
    # Libraries' logs (vLLM, transformers, torch ...) and Python warnings on the console too; they
    # always go to <output_dir>/run.log (TOOLGRPO_LOG_LEVEL=INFO|DEBUG does the same).
    verbose: bool = False
    # verl's key: each step's episodes as <dir>/<step>.jsonl ("" = off; ``toolgrpo eval`` too)
    rollout_data_dir: str = ""
    rollout_data_samples_per_step: int = 64  # rows written per step, whole groups first; -1 = all
    # Modules registering environment types (``@register_env``), imported before the config is
    # checked, here and in every Ray rollout worker: module names or paths to .py files. The
    # CLI's --import adds to them; installed ``toolgrpo.envs`` entry points load anyway.
    imports: list[str] = field(default_factory=list)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    # Where the actor, reference, value and router heads and the batch live: auto = CUDA (the
    # local rank's GPU) when available, else CPU; or cpu, cuda, cuda:N. Rollout engines keep theirs.
    device: str = "auto"
    nnodes: int = 1  # verl's: nodes of an fsdp2 run
    # verl's: ranks per node (GPUs, or processes on CPU); 0 = whatever torchrun started. When set,
    # nnodes × n_gpus_per_node must equal the world size.
    n_gpus_per_node: int = 0


@dataclass
class AsyncTrainingConfig:
    """Rollouts on a background thread against a copy of the policy (``toolgrpo.trainer.replay``);
    batches may be up to ``staleness_threshold`` policy versions old. 0 = the synchronous loop."""

    enable: bool = False
    staleness_threshold: int = 0


# Old spellings that still load, each with a warning naming the key that replaced it
# (config.loader.apply_aliases). A key ending in "." renames a whole section; a dict value maps
# the old key's values to new (key, value) settings.
TRAIN_KEY_ALIASES: dict[str, str | dict[str, dict[str, Any]]] = {
    "rollout_only.schedule.alpha0": "rollout_allocation_schedule.alpha_0",
    "rollout_only.schedule.": "rollout_allocation_schedule.",
    "rollout_only.is_threshold": "rollout_only.rollout_is_threshold",
    "rollout_only.is_correction": {
        "ppo_clip": {"rollout_only.bypass_mode": True},
        "tis_token": {"rollout_only.bypass_mode": False, "rollout_only.rollout_is": "token"},
        "tis_seq": {"rollout_only.bypass_mode": False, "rollout_only.rollout_is": "sequence"},
    },
}


@dataclass
class TrainConfig:
    key_aliases: ClassVar[dict] = TRAIN_KEY_ALIASES
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    rollout_only: RolloutOnlyConfig = field(default_factory=RolloutOnlyConfig)
    rollout_allocation_schedule: RolloutAllocationScheduleConfig = field(
        default_factory=RolloutAllocationScheduleConfig
    )
    router: RouterConfig = field(default_factory=RouterConfig)  # budgeted tool router (#4)


def data_seed(cfg: TrainConfig) -> int:
    """The task order's seed: ``data.seed``, or ``trainer.seed`` when unset (one seed per run)."""
    return cfg.data.seed if cfg.data.seed is not None else cfg.trainer.seed


def as_dict(cfg: Any) -> dict:
    """A plain dict of a config dataclass, for logging and checkpoints (secrets redacted)."""
    from dataclasses import asdict

    from toolgrpo.config.loader import redact_secrets

    return redact_secrets(asdict(cfg))
