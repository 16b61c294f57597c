"""helpers: the real code behind the Agentic RL Workbook.

One module per job, in layers: a module imports only the layers below it, at file level and
inside functions (the contract is in pyproject.toml; ``lint-imports`` checks it, with no cycle).
Bottom to top:

    formats, paths, config  the one parser (answer tag, tool calls, numbers, ``judge_answer``); TrainConfig and the preset registry
    floats        denormal floats flushed to zero (attention's tiny probabilities, off the CPU's slow path)
    hub           is the Hugging Face Hub reachable; an optional package, or how to install it
    data          (数据模块)  Task, the dataset registry, prompts, leak-free splits, TaskSampler, JSONL
    envs          (环境模块)  TRL's environment contract, the ``Episode`` adapter (``step``), registry, checkers, math / calculator / code envs
    sandbox       (环境模块)  untrusted code behind an OS boundary
    policy        (采样模块)  model loading and the rollout backends (transformers, vLLM), one interface
    rollout       (采样模块)  Trajectory and the batched multi-turn sampling loop
    rewards       (奖励模块)  rule rewards, weighted combination, reward report; ``judge``: model judges
    grpo, sft     (训练模块)  advantages, the GRPO loss, LoRAGRPO; the SFT warm start
    checkpoint    the run folder on disk: checkpoints (atomic, with checksums), RNG state, the lock, the resume check
    loop          the one training loop (a world's step is a registered collector); ``evaluation``: held-out
                  success, pass@k, ``episode_stats``; ``benchmarks``: the public benchmarks and answer-file scoring;
                  ``live``: curves; ``health``: warnings during a run
    worlds        one folder per world (arithmetic, shop, selfplay, gsm8k, reasoning_gym, humaneval): tasks, env, presets, warm start;
                  they register themselves; ``worlds.tinymodel``: the tiny models' template, tokenizer, shape
    train, evaluate   the commands (``python -m helpers.train``, ``python -m helpers.evaluate``); they import the worlds
    viewer, notebook  pictures; the notebooks' opening

Side rooms, which import the core and which the core never imports:

    ecosystem     TRL's trainer (``trl_bridge``), OpenAI-compatible endpoints, OpenEnv serving and its remote env
    serve         the agent as a service that keeps learning from its users (``python -m helpers.serve``)
    lab           benchmarks, the train-inference mismatch, the GPU memory plan, the preflight checklist

Data flows one way:
    Task -> env.reset -> (policy acts -> env tools, via Episode.step)* -> Trajectory -> reward -> advantages -> GRPO update
"""

__version__ = "0.1.0"
