"""The router as part of the actor: the head on the actor's LM, its forward API and its update.

``forward`` is what the issue calls the actor's router API: prompt ids in, ``router_logits``
``[B, K]``, ``router_action`` and ``router_log_prob`` out. Features come from the LM without
gradient, so the router loss trains the head only; the LM learns (unless frozen) from its own
GRPO/PPO loss. The head has its own SGD, or joins the actor's optimizer as a param group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from toolgrpo.algos.router import router_loss
from toolgrpo.data.task import Task
from toolgrpo.rollout.prompts import render_prompt
from toolgrpo.router.head import HeadAverage, RouterHead, RouterOutput, prompt_features
from toolgrpo.router.offset import OFFSET_KEY, AnswerOffset
from toolgrpo.router.routes import ANSWER
from toolgrpo.router.spec import RouterMismatch


class RouterPolicy:
    def __init__(
        self,
        lm: Any,  # models.loading.Policy (its ``base`` LM and ``autocast``)
        routes: Sequence[str],
        pooling: str = "last",
        head_hidden: int = 0,
        lr: float | None = 1.0,
        grad_clip: float = 1.0,
        actor_optimizer: torch.optim.Optimizer | None = None,
        actor_scheduler: Any = None,
        feature_layer: int = -1,
        inputs: str = "opening",
        tool_format: str = "hermes",
        feature_norm: str = "standardize",
        head_ema: float = 0.0,
    ) -> None:
        self.lm = lm
        self.routes = [r.upper() for r in routes]
        self.pooling = pooling
        self.feature_layer = feature_layer
        self.inputs = inputs  # what the prompts given to ``features`` are (router.inputs)
        # The episodes' tool-call format (multi_turn.format): openings list tools with its
        # calling instructions, as the model sees them.
        self.tool_format = tool_format
        # Tasks → the prompt ids the head reads (``router.inputs.RouterInputs``); set by whoever
        # knows the environments (the trainer, ``toolgrpo eval``).
        self.prompt_source: Callable[[Sequence[Task]], list[list[int]]] | None = None
        self.grad_clip = grad_clip
        hidden = lm.base.config.hidden_size
        # On the LM's device (trainer.device): its features never leave it.
        self.head = RouterHead(hidden, len(self.routes), head_hidden, feature_norm)
        if getattr(lm, "device", None) is not None:
            self.head.to(lm.device)
        # router.head_ema: the weights validation, eval and infer route with
        self.average = HeadAverage(self.head, head_ema) if head_ema > 0 else None
        # The budget offset of the served head (router/offset.py): fit by validation or eval,
        # applied with the averaged weights, saved in router.pt.
        self.offset: AnswerOffset | None = None
        self.shared = lr is None
        if self.shared:
            if actor_optimizer is None:
                raise ValueError("router.lr=null shares the actor's optimizer, but none was given")
            actor_optimizer.add_param_group({"params": list(self.head.parameters())})
            self.optimizer = actor_optimizer
            if actor_scheduler is not None:
                _follow_schedule(actor_scheduler, actor_optimizer.param_groups[-1])
        else:
            self.optimizer = torch.optim.SGD(self.head.parameters(), lr=lr)

    @property
    def meta(self) -> dict[str, Any]:
        """What rebuilding the head needs (stored in checkpoints, read by ``toolgrpo infer``)."""
        h = self.head
        return {
            "routes": self.routes,
            "pooling": self.pooling,
            "feature_layer": self.feature_layer,
            "inputs": self.inputs,
            "hidden_size": h.hidden_size,
            "head_hidden": h.mlp_hidden,
            "feature_norm": h.feature_norm,
            # recorded only when not the default, so hermes heads' meta is what it always was
            **({"tool_format": self.tool_format} if self.tool_format != "hermes" else {}),
        }

    def features_of(self, tasks: Sequence[Task], max_prompt_length: int = 10**9) -> torch.Tensor:
        """Features of tasks, read from what ``prompt_source`` renders for them (the
        environments' openings, ``router.inputs``); without one, the tasks' own messages."""
        if self.prompt_source is not None:
            prompts = self.prompt_source(tasks)
        else:
            tok = self.lm.tokenizer
            prompts = [render_prompt(tok, t.messages, max_prompt_length, "left") for t in tasks]
        return self.features(prompts)

    def read_tasks_with(self, envs: Any, max_prompt_length: int) -> None:
        """Read tasks as this head was trained to (``inputs``): the environments' openings."""
        from toolgrpo.router.inputs import RouterInputs

        self.prompt_source = RouterInputs(
            self.lm.tokenizer, max_prompt_length, envs, self.inputs, self.tool_format
        )

    def features(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        pad = self.lm.tokenizer.pad_token_id
        return prompt_features(
            self.lm.base,
            prompts,
            pad,
            self.pooling,
            autocast=self.lm.autocast,
            layer=self.feature_layer,
        )

    def observe(self, features_BH: torch.Tensor) -> None:
        """Fold training prompts' features into the head's running statistics (before acting
        on them; held-out prompts are never observed)."""
        self.head.observe(features_BH)

    @torch.no_grad()
    def act(self, features_BH: torch.Tensor, sample: bool = True) -> RouterOutput:
        return self.head.act(features_BH, sample)

    def forward(self, prompts: Sequence[Sequence[int]], sample: bool = True) -> RouterOutput:
        """Route prompts: their features, then the head (with gradient through the head)."""
        return self.head.act(self.features(prompts), sample)

    def update(
        self,
        features_BH: torch.Tensor,
        actions_B: torch.Tensor,
        advantages_B: torch.Tensor,
        entropy_coeff: float,
        labels_B: torch.Tensor | None = None,
        label_coeff: float = 0.0,
    ) -> dict[str, float]:
        """One optimizer step on the router loss (logits recomputed with gradient)."""
        self.head.train()
        self.optimizer.zero_grad(
            set_to_none=True
        )  # shared: the LM's grads too, so only the head steps
        logits = self.head(features_BH)
        dev = logits.device
        labels = labels_B.to(dev) if labels_B is not None else None
        loss, metrics = router_loss(
            logits, actions_B.to(dev), advantages_B.to(dev), entropy_coeff, labels, label_coeff
        )
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(self.head.parameters()), self.grad_clip)
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average is not None:
            self.average.update(self.head)
        metrics["router/grad_norm"] = float(norm)
        return metrics

    @contextmanager
    def averaged(self) -> Iterator[None]:
        """Route as the head is served inside the block: the averaged weights
        (``router.head_ema``) and the budget offset; the last iterate without an offset, which
        training goes on from, comes back after it."""
        average = self.average is not None and self.average.steps > 0
        last = {k: v.clone() for k, v in self.head.net.state_dict().items()} if average else None
        if average:
            self.head.net.load_state_dict(self.average.averaged())
        self.head.logit_shift = self.shift()
        try:
            yield
        finally:
            self.head.logit_shift = None
            if last is not None:
                self.head.net.load_state_dict(last)

    def shift(self, delta: float | None = None) -> torch.Tensor | None:
        """The logit shift of an offset δ (the fitted one by default): δ on ANSWER, 0 elsewhere;
        None without one."""
        if delta is None:
            delta = self.offset.delta if self.offset is not None else 0.0
        if delta == 0.0 or ANSWER not in self.routes:
            return None
        out = torch.zeros(len(self.routes))
        out[self.routes.index(ANSWER)] = float(delta)
        return out

    def adopt_average(self, state: dict[str, Any]) -> None:
        """For inference: route as the checkpoint's head was served, its averaged weights when
        it saved them and its budget offset when it has one."""
        got = state.get("head_average")
        if got and int(got["steps"]) > 0:
            average = HeadAverage(self.head, float(got["decay"]))
            average.load_state_dict(got)
            self.head.net.load_state_dict(average.averaged())
        self.serve_offset(AnswerOffset.from_state(state.get(OFFSET_KEY)))

    def serve_offset(self, offset: AnswerOffset | None) -> None:
        """Keep ``offset`` and route with it from now on (a head that only serves: eval, infer)."""
        self.offset = offset
        self.head.logit_shift = self.shift()

    def state_dict(self) -> dict[str, Any]:
        opt = None if self.shared else self.optimizer.state_dict()  # shared: in optimizer.pt
        state = {"meta": self.meta, "head": self.head.state_dict(), "optimizer": opt}
        if self.average is not None:
            state["head_average"] = self.average.state_dict()
        if self.offset is not None:
            state[OFFSET_KEY] = self.offset.to_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        meta = state.get("meta", {})
        mine = self.meta
        meta = {"feature_norm": "layer", **meta}  # heads before router.feature_norm: layer
        for key in (
            "routes",
            "hidden_size",
            "head_hidden",
            "pooling",
            "feature_layer",
            "inputs",
            "feature_norm",
        ):
            if key in meta and meta[key] != mine[key]:
                fix = f"; set router.{key}={meta[key]}" if key != "hidden_size" else ""
                raise RouterMismatch(
                    f"the checkpoint's router head has {key}={meta[key]!r}, this run "
                    f"{mine[key]!r}{fix}"
                )
        fmt = meta.get("tool_format", "hermes")  # heads before it read hermes openings
        if fmt != self.tool_format:
            raise RouterMismatch(
                f"the checkpoint's router head read tool_format={fmt!r} openings, this run "
                f"{self.tool_format!r} (actor_rollout_ref.rollout.multi_turn.format)"
            )
        self.head.load_state_dict(state["head"])
        if self.average is not None and state.get("head_average"):
            self.average.load_state_dict(state["head_average"])
        self.offset = AnswerOffset.from_state(state.get(OFFSET_KEY))
        if state.get("optimizer") is not None and not self.shared:
            lrs = [g["lr"] for g in self.optimizer.param_groups]  # router.lr as configured now
            self.optimizer.load_state_dict(state["optimizer"])
            for g, lr in zip(self.optimizer.param_groups, lrs, strict=True):
                g["lr"] = lr


def _follow_schedule(scheduler: Any, group: dict[str, Any]) -> None:
    """Give a param group added after the actor's ``LambdaLR`` was built the actor's schedule
    (the scheduler steps every group, and requires one lambda and base lr per group)."""
    group.setdefault("initial_lr", group["lr"])
    scheduler.base_lrs.append(group["initial_lr"])
    if hasattr(scheduler, "lr_lambdas"):
        scheduler.lr_lambdas.append(scheduler.lr_lambdas[0])
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr.append(group["lr"])
