"""TRL, in one place: the config mapping, the reward adapter, a world in TRL's tool loop, and the loss cross-check.

The workbook writes GRPO out by hand (``helpers.grpo``) so a reader can see every line,
and checks it against the library the field uses, TRL's ``GRPOTrainer``. Everything that
touches TRL lives here, so the rest of ``helpers`` runs (and reads) without it:

    args = grpo_config(config, "runs/trl")                # TrainConfig -> trl.GRPOConfig, one mapping
    funcs, weights = reward_funcs(config)                 # the preset's rewards in TRL's reward_funcs form
    trainer = grpo_trainer(config, model, tokenizer, tasks, "runs/trl", environment=environment_factory(config))
    trainer.train()                                       # a world, multi-turn, in TRL's own GRPOTrainer
    result = compare_with_trl(trainer, tokenizer, tasks)  # the same batch through both losses

The scale-out script (``scripts/trl_multi_gpu.py``), the tests (``tests/test_grpo_trl.py``,
``tests/test_trl_env.py``) and the benchmark (``python -m helpers.lab.bench grpo``) all build TRL's
config with ``grpo_config``: one mapping, so a setting cannot mean one thing here and another there.
The LoRA side of the mapping is ``helpers.grpo.lora_config`` (peft, not TRL), which
``LoRAGRPO`` uses too.

Taught in notebooks/05_trainer.ipynb (the cross-check) and notebooks/04_reward.ipynb (the adapter).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch
from datasets import Dataset

from helpers.config import TrainConfig
from helpers.data import Task, parse_mix
from helpers.envs import LIMITS, new_env, tool_methods
from helpers.grpo import collate, group_advantages, group_rewards, grpo_loss, lora_config
from helpers.loop import is_mix
from helpers.policy.vllm import quiet_torch_jit
from helpers.rewards import finite_total, get_reward, reward_name, safe_call
from helpers.rollout import Trajectory
from helpers.worlds.tinymodel import CHAT_TEMPLATE

# ----------------------------------------------------------------------------------------------
# 1. TrainConfig -> GRPOConfig
# ----------------------------------------------------------------------------------------------


def import_trl():
    """The ``trl`` module, imported quietly. TRL 1.16 warns at import that it was tested with
    vLLM 0.22-0.31; the CPU extra installs vLLM 0.32. Tested with it: transformers generation
    (tests/test_scale_out.py) and importing the server client; no test connects to a vLLM server.
    The vLLM it imports brings in torch's deprecated ``torch.jit.script_method`` (``quiet_torch_jit``).
    TRL is imported here, on first use, not at the top: it is heavy, and the rest of ``helpers`` runs without it."""
    with warnings.catch_warnings(), quiet_torch_jit():
        warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
        import trl
        from trl.trainer import grpo_trainer  # noqa: F401  the submodule that imports the vLLM client
    # TRL 1.16 and peft read transformers' deprecated ``is_gradient_checkpointing`` at every generation
    # (a FutureWarning from transformers 5.20 on, what a fresh install gets), inside TRL's own calls where no
    # ``quiet_peft`` of ours can reach: that one warning is ignored for the process once TRL is in use.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    return trl


def batch_split(config: TrainConfig, processes: int = 1) -> tuple[int, int]:
    """(sequences per micro-batch, micro-batches per process) for one optimizer step of
    ``tasks_per_step * num_generations`` completions shared by ``processes`` trainers.

    >>> batch_split(TrainConfig(tasks_per_step=8, num_generations=8, grad_accum=4), processes=2)
    (16, 2)
    """
    completions = config.tasks_per_step * config.num_generations
    if completions % config.grad_accum:
        raise ValueError(f"grad_accum={config.grad_accum} must divide the {completions} completions of a step")
    if config.grad_accum % processes:
        sizes = [n for n in range(1, config.grad_accum + 1) if config.grad_accum % n == 0]
        raise ValueError(f"{processes} training processes must divide grad_accum={config.grad_accum} "
                         f"(each runs an equal share of the micro-batches); possible process counts: {sizes}")
    return completions // config.grad_accum, config.grad_accum // processes


def grpo_config(config: TrainConfig, output_dir: str | Path, processes: int = 1, multi_turn: bool = False, **overrides):
    """``config`` as a ``trl.GRPOConfig``: the same loss, clip, beta, batch, optimizer and schedule.

    ``processes`` shares one optimizer step between data-parallel trainers (``accelerate
    launch``); ``multi_turn`` maps the episode limits for TRL's tool loop (an env with tools);
    ``overrides`` sets TRL-only options (``use_vllm=True``, ``vllm_mode="server"``,
    ``save_steps``, ...) on top.
    """
    GRPOConfig = import_trl().GRPOConfig

    micro_batch, accumulation = batch_split(config, processes)
    on_gpu = torch.cuda.is_available()
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    # transformers 5.19's field is gradient_checkpointing (activation_checkpointing is only an fsdp_config key there);
    # a version whose TrainingArguments has an activation_checkpointing field gets that one
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    args = dict(
        output_dir=str(output_dir),
        # the optimizer step: tasks_per_step x G completions, as in helpers.loop
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        num_generations=config.num_generations,
        max_completion_length=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        max_steps=config.steps,
        # the loss: the same names and values as helpers.grpo
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        beta=config.beta,
        epsilon=config.epsilon_low,
        epsilon_high=config.epsilon_high,
        num_iterations=config.num_iterations,
        mask_truncated_completions=config.mask_truncated_completions,
        # the train-inference correction (it acts only when vLLM samples, in TRL as in helpers.grpo)
        vllm_importance_sampling_correction=config.vllm_importance_sampling_correction,
        vllm_importance_sampling_mode=config.vllm_importance_sampling_mode,
        vllm_importance_sampling_clip_max=config.vllm_importance_sampling_clip_max,
        vllm_importance_sampling_clip_min=config.vllm_importance_sampling_clip_min,
        # the optimizer
        learning_rate=config.lr,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        lr_scheduler_type="linear",
        bf16=on_gpu and config.dtype == "bfloat16",
        use_cpu=not on_gpu,
        seed=config.seed,
        # logging
        logging_steps=1,
        report_to=config.report_to or "none",
        save_strategy="no",
        disable_tqdm=True,
    )
    args[checkpointing] = config.gradient_checkpointing
    if multi_turn:
        # TRL's completion is then the whole episode (every turn and every tool reply), and each
        # tool-calling round is one more turn: env_max_steps turns are env_max_steps - 1 rounds.
        # Simplifications, named: our max_total_tokens counts the prompt too, TRL's budget does not
        # (so TRL's is larger by the prompt); and TRL has no per-turn cap like max_new_tokens.
        args.update(max_completion_length=config.max_total_tokens, max_tool_calling_iterations=config.env_max_steps - 1)
    return GRPOConfig(**{**args, **overrides})


# ----------------------------------------------------------------------------------------------
# 2. Our rewards in TRL's reward_funcs signature
# ----------------------------------------------------------------------------------------------

_TRL_RESERVED = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")


def to_trl_reward_func(fn) -> Callable[..., list[float]]:
    """Wrap a reward (name or function) for ``trl.GRPOTrainer(reward_funcs=[...])``.

    TRL 1.16 calls ``f(prompts=..., completions=..., completion_ids=..., **columns)``
    where each completion is a string (plain-text datasets) or a list of message dicts
    (chat datasets; with tools, assistant messages carry ``tool_calls`` and tool
    results are ``{"role": "tool"}`` messages), and every other dataset column comes
    as a keyword list (GSM8K's ``answer``). Each row becomes a small Trajectory
    (no env info, so ``correct`` falls back to ``check_answer`` against ``answer``).
    The wrapper is named after the reward, so TRL logs ``rewards/<name>/mean``.

    Taught in notebooks/04_reward.ipynb §3.
    """

    fn_ = get_reward(fn)
    name = fn if isinstance(fn, str) else reward_name(fn_)

    def trl_reward(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        columns = {k: v for k, v in kwargs.items() if k not in _TRL_RESERVED}
        out = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row = {k: v[i] for k, v in columns.items()}
            traj = trajectory_from_text(prompt, completion, row, completion_ids[i] if completion_ids else None, i)
            parts = safe_call(fn_, name, traj)[0]
            out.append(finite_total(traj, name, parts, sum(parts.values()))[0])  # a dict whose parts overflow: 0, an error
        return out

    trl_reward.__name__ = name
    return trl_reward


def reward_funcs(config: TrainConfig) -> tuple[list[Callable], list[float]]:
    """The preset's rewards (``config.rewards``, name -> weight) as TRL's ``reward_funcs`` and
    ``reward_weights``: TRL logs each as ``rewards/<name>/mean``, as our loop does."""
    return [to_trl_reward_func(name) for name in config.rewards], [float(w) for w in config.rewards.values()]


def trajectory_from_text(prompt, completion, row: dict | None = None, token_ids=None, index: int = 0) -> Trajectory:
    """A minimal Trajectory from a prompt and completion (strings or message lists), for TRL and tests."""
    row = row or {}
    prompt_msgs = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    completion_msgs = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
    token_ids = list(token_ids) if token_ids is not None else []
    task = Task(id=str(row.get("id", f"row-{index}")), prompt=prompt_msgs, answer=row.get("answer"), metadata=row)
    return Trajectory(
        task=task, group=0, token_ids=token_ids, mask=[1] * len(token_ids), logprobs=[0.0] * len(token_ids), prompt_len=0,
        turns=sum(m["role"] == "assistant" for m in completion_msgs), messages=prompt_msgs + completion_msgs,
    )


# ----------------------------------------------------------------------------------------------
# 3. A world in TRL's GRPOTrainer: its tasks as rows, its env as environment_factory
# ----------------------------------------------------------------------------------------------


def trl_dataset(tasks: list[Task]):
    """``tasks`` as TRL's training dataset: one row per task (``Task.row``: ``prompt``, ``answer`` and
    the task's metadata, such as the shop's hidden ``item`` and ``prices``). TRL passes every column
    to the env's ``reset(**row)``, as our loop does, and to each reward function.

    The rows go through Arrow (``datasets``), which our loop does not do: a metadata key that some
    tasks lack arrives as None in theirs, a dict column gets the union of all rows' keys (the
    missing ones None), and a column whose rows mix types cannot be built. The built-in worlds'
    rows are uniform, so their envs see the same rows in both loops. A mix of worlds (tasks that name their
    environment) also gets TRL's ``environment`` column, which routes each row to its environment; its
    worlds' columns are united, so a row gets None in the columns of the other worlds (their envs never see it)."""
    rows = [{**task.row(), "environment": task.environment} if task.environment is not None else task.row() for task in tasks]
    columns = dict.fromkeys(key for row in rows for key in row)  # every row's (from_list would keep the first row's only)
    return Dataset.from_dict({column: [row.get(column) for row in rows] for column in columns})


def environment_factory(config: TrainConfig) -> Callable | dict[str, Callable] | None:
    """TRL's ``environment_factory`` for ``config.env``: a function that makes the registered env,
    bare (``helpers.envs.new_env``, with the constructor's options of ``config.env_kwargs``), or
    None when that env has no tools (a single-turn world: TRL needs only the reward functions).
    Our loop's adapter (``Episode``) and its limits stay out: TRL's tool loop does that part.

    A mixed dataset (``helpers.data.mix_datasets``) gets TRL's multi-environment form, the same dict our
    loop's rollout picks from: ``{environment name: function}``, one per part, ``config.env_classes``
    replacing a named one's class; TRL reads each row's ``environment`` column (``trl_dataset``)."""
    options = {key: value for key, value in config.env_kwargs.items() if key not in LIMITS}
    if is_mix(config):
        names = dict.fromkeys(environment for _, environment in parse_mix(config.dataset))
        return {name: functools.partial(new_env, config.env_classes.get(name, name), **options) for name in names}

    def make():
        return new_env(config.env, **options)

    return make if tool_methods(make()) else None


def add_tool_parser(tokenizer) -> None:
    """Let TRL read the tiny models' tool calls: give their tokenizer a response template.

    TRL turns each generated turn back into a message (``content`` and ``tool_calls``) with the
    tokenizer's response parser. It ships parsers only for chat templates it knows (Qwen2.5's is
    one, so the GSM8K models need nothing) and refuses the tiny models' own template
    (``helpers.worlds.tinymodel.CHAT_TEMPLATE``). That template writes Qwen2.5's tool format, so
    the parser TRL gives Qwen2.5 (its Qwen3 one) reads it. Any other template is left to TRL.
    (This new-style parser needs transformers >= 5.13.)
    """
    from trl.chat_template_utils import qwen3_template  # TRL on first use, as in import_trl

    if tokenizer.chat_template == CHAT_TEMPLATE:
        tokenizer.response_template = qwen3_template


def grpo_trainer(config: TrainConfig, model, tokenizer, tasks: list[Task], output_dir: str | Path, processes: int = 1,
                 environment: Callable | dict[str, Callable] | None = None, **overrides):
    """TRL's own ``GRPOTrainer`` on a workbook world: ``tasks`` as its dataset (``trl_dataset``),
    the preset's rewards, GRPO and LoRA settings, and, for a multi-turn world, ``environment``
    as its ``environment_factory`` (an env class, ``environment_factory(config)``, or a dict of them by
    environment name for a mix of worlds, each row routed by its ``environment`` column): TRL then
    runs the episodes itself, calling the env's tool methods and masking their replies out of
    the loss (``tool_mask``). ``overrides`` are TRL-only GRPOConfig options.
    """
    GRPOTrainer = import_trl().GRPOTrainer

    multi_turn = environment is not None
    if multi_turn:
        add_tool_parser(tokenizer)
    funcs, weights = reward_funcs(config)
    args = grpo_config(config, output_dir, processes, multi_turn=multi_turn, reward_weights=weights, **overrides)
    with warnings.catch_warnings():  # environment_factory is marked experimental in TRL 1.16: we know, and test it
        warnings.filterwarnings("ignore", message="You are using 'environment_factory'")
        return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=funcs, args=args,
                           train_dataset=trl_dataset(tasks), peft_config=lora_config(config),
                           environment_factory=environment)


# ----------------------------------------------------------------------------------------------
# 4. The same batch through TRL's GRPOTrainer (test, notebook 05, benchmark)
# ----------------------------------------------------------------------------------------------


def trl_trainer(model, tokenizer, config: TrainConfig, prompts: list[list[dict]], max_completion_length: int,
                output_dir: str | Path, peft_config=None):
    """A TRL ``GRPOTrainer`` with the settings of ``config`` (``grpo_config``), on a tiny dataset of ``prompts``.

    The reward function is a placeholder: callers that compare losses feed their own
    rewards or advantages.
    """
    GRPOTrainer = import_trl().GRPOTrainer

    args = grpo_config(config, output_dir, max_completion_length=max_completion_length)
    dataset = Dataset.from_list([{"prompt": p} for p in prompts])
    placeholder = lambda completions, **kwargs: [0.0] * len(completions)  # noqa: E731
    return GRPOTrainer(model=model, reward_funcs=placeholder, args=args, train_dataset=dataset,
                       processing_class=tokenizer, peft_config=peft_config)


def completion_aligned(full: torch.Tensor, trajectories: list[Trajectory], width: int) -> torch.Tensor:
    """(N, T) token-aligned values -> (N, width), TRL's layout: column j is completion token j (the prompt cut off)."""
    out = torch.zeros(full.size(0), width, dtype=full.dtype)
    for n, t in enumerate(trajectories):
        values = full[n, t.prompt_len : len(t.token_ids)]
        out[n, : len(values)] = values
    return out


def trajectories_from_trl(inputs: dict, tasks, rewards: list[float]) -> list[Trajectory]:
    """TRL's batch (left-padded prompts, right-padded completions) as our Trajectories:
    unpadded prompt + completion, mask 1 on the completion except where TRL's ``tool_mask``
    (multi-turn) marks a tool's tokens. Old log-probs are left at 0."""
    G = len(rewards) // len(tasks)
    tool_mask = inputs.get("tool_mask")
    trajectories = []
    for n in range(len(rewards)):
        prompt = inputs["prompt_ids"][n][inputs["prompt_mask"][n].bool()].tolist()
        kept = inputs["completion_mask"][n].bool()
        completion = inputs["completion_ids"][n][kept].tolist()
        policy = [1] * len(completion) if tool_mask is None else tool_mask[n][kept].tolist()
        trajectories.append(Trajectory(task=tasks[n // G], group=n % G, token_ids=prompt + completion,
                                       mask=[0] * len(prompt) + policy,
                                       logprobs=[0.0] * (len(prompt) + len(completion)), prompt_len=len(prompt),
                                       reward=rewards[n]))
    return trajectories


def tool_spans(completion_mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A ``tool_mask`` (N, C) for a multi-turn batch: in each completion of 3 or more tokens, one
    span in the middle stands for a tool's reply (0: not the policy's tokens), with policy tokens
    before and after it, as in call -> tool result -> answer."""
    tool_mask = torch.ones_like(completion_mask)
    for n, length in enumerate(completion_mask.sum(1).tolist()):
        if length >= 3:
            start = int(torch.randint(1, length - 1, (), generator=generator))
            end = int(torch.randint(start + 1, length, (), generator=generator))
            tool_mask[n, start:end] = 0
    return tool_mask


def compare_with_trl(trainer, tokenizer, tasks, max_completion_length: int = 16,
                     old_noise: float = 0.3, seed: int = 0, multi_turn: bool = False) -> dict:
    """Feed one batch to our loss and to TRL's ``GRPOTrainer._compute_loss``; return both.

    1. TRL samples G completions per task (its own generate), and its reward function
       draws random rewards; TRL turns them into advantages.
    2. Completions are cut to random lengths (the untrained tiny model rarely stops by
       itself, and grpo / dr_grpo / dapo only differ when lengths differ).
    3. ``multi_turn``: a span inside each completion is marked as a tool's reply, as TRL's
       tool loop marks it (``tool_mask`` 0), and as our rollout marks env tokens (mask 0):
       those tokens are context for the later ones but never trained on.
    4. "Old" log-probs = current log-probs + noise, so ratios spread and the clip bites.
    5. The same tokens, old log-probs and reference log-probs (ours: adapter off) go to
       both losses. TRL gets a *copy* of our peft model, so the weights are identical.
    Returns ours/trl losses, advantages, and both clip fractions (and KL when beta > 0).

    Taught in notebooks/05_trainer.ipynb §5.
    """
    cfg = trainer.config
    G = cfg.num_generations
    gen = torch.Generator().manual_seed(seed)
    rewards_drawn = torch.randint(0, 3, (len(tasks) * G,), generator=gen).float().tolist()
    with tempfile.TemporaryDirectory() as tmp:
        trl = trl_trainer(copy.deepcopy(trainer.model), tokenizer, replace(cfg, tasks_per_step=len(tasks), grad_accum=1),
                          [t.prompt for t in tasks], max_completion_length, tmp)
    trl.reward_funcs[0] = lambda completions, **kwargs: rewards_drawn[: len(completions)]
    trl.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we call the loss directly
    trl.model.train()
    torch.manual_seed(seed)
    rows = [{"prompt": t.prompt} for t in tasks for _ in range(G)]  # TRL's sampler repeats each prompt G times
    inputs = trl._generate_and_score_completions(rows)
    width = inputs["completion_mask"].shape[1]  # C: TRL pads to the longest completion, which can be < max_completion_length
    lengths = torch.randint(1, width + 1, (len(rows),), generator=gen)
    keep = torch.arange(width)[None, :] < lengths[:, None]  # (N, C)
    inputs["completion_mask"] = inputs["completion_mask"] * keep
    if multi_turn:
        inputs["tool_mask"] = tool_spans(inputs["completion_mask"], gen)
    inputs["num_items_in_batch"] = (inputs["completion_mask"] * inputs.get("tool_mask", 1)).sum()  # dapo: policy tokens

    trajectories = trajectories_from_trl(inputs, tasks, rewards_drawn)
    batch = collate(trajectories, group_advantages(group_rewards(trajectories), cfg.scale_rewards))
    with torch.no_grad():
        current = trainer.logprobs(batch.input_ids, batch.mask)  # (N, T)
    old = (current + old_noise * torch.randn(current.shape, generator=gen)) * batch.mask  # (N, T)
    ref = trainer.logprobs(batch.input_ids, batch.mask, reference=True) if cfg.beta != 0.0 else None

    trainer.model.train()
    logps = trainer.logprobs(batch.input_ids, batch.mask)
    ours, metrics = grpo_loss(logps, old, batch.advantages, batch.mask, ref, loss_type=cfg.loss_type,
                              epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high, beta=cfg.beta,
                              max_completion_length=max_completion_length)
    inputs["old_per_token_logps"] = completion_aligned(old, trajectories, max_completion_length)
    if ref is not None:
        inputs["ref_per_token_logps"] = completion_aligned(ref, trajectories, max_completion_length)
    theirs = trl.compute_loss(trl.model, inputs)
    trl_metrics = {k: v[-1] for k, v in trl._metrics["train"].items()}
    # The same loss value could still hide a different gradient (a misplaced detach): compare those too.
    trainer.model.zero_grad()
    ours.backward()
    theirs.backward()
    trl_params = dict(trl.model.named_parameters())
    grad_diff = max((p.grad - trl_params[n].grad).abs().max().item()
                    for n, p in trainer.model.named_parameters() if p.requires_grad)
    trainer.model.zero_grad()
    return {"ours": ours.item(), "trl": theirs.item(), "grad_max_diff": grad_diff, "advantages_ours": batch.advantages,
            "advantages_trl": inputs["advantages"], "clip_ours": metrics["clip_ratio/region_mean"],
            "clip_trl": trl_metrics["clip_ratio/region_mean"], "kl_ours": metrics.get("kl"), "kl_trl": trl_metrics.get("kl"),
            "tokens": int(batch.mask.sum())}
