"""helpers: the real code behind the Agentic RL Workbook.

One module per job; a module imports only modules of earlier stages (``formats`` and
``data`` below everything, the trainer never imported by rewards, the pictures never
imported by the stages):

    formats       the one parser: answer tag, tool calls, numbers, ``judge_answer``
    data          (数据模块)  Task, dataset registry (GSM8K hub / local, tiny worlds), prompts, splits, TaskSampler, JSONL
    tiny          (数据模块)  the tiny one-call world: tasks, tokenizer, model, SFT build
    envs          (环境模块)  TRL's environment contract, the ``Episode`` adapter (``step``), registry, checkers, math / calculator / code envs
    sandbox       (环境模块)  untrusted code behind an OS boundary
    policy        (采样模块)  model loading and the rollout backends (transformers, vLLM), one interface
    rollout       (采样模块)  Trajectory and the batched multi-turn sampling loop
    rewards       (奖励模块)  rule rewards, weighted combination, reward report; ``judge``: model judges
    grpo, sft     (训练模块)  advantages, the GRPO loss, LoRAGRPO, checkpoints; the SFT warm start
    evaluate      held-out success, pass@k, tool calls; ``episode_stats``; a CLI
    train         the loop and its command line, nothing else
    trl_compat    everything that touches TRL: config mapping, reward adapter, loss cross-check
    live, viewer  live curves and logging; trajectory and reward pictures
    memory, pitfalls  GPU memory plan; health checks and the preflight checklist

Data flows one way:
    Task -> env.reset -> (policy acts -> env tools, via Episode.step)* -> Trajectory -> reward -> advantages -> GRPO update
"""

__version__ = "0.1.0"
