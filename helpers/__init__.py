"""helpers: the real code behind the Agentic RL Workbook.

One module per pipeline stage (see ../DESIGN in the README):

    data      (数据模块)  Task, GSM8K loader, prompts, batching
    envs      (环境模块)  Env contract, MathEnv, CalculatorEnv, CodeEnv, registry
    rollout   (采样模块)  Trajectory and the parallel multi-turn sampling loop
    rewards   (奖励模块)  rule / judge / hybrid rewards and diagnostics
    grpo, sft (训练模块)  LoRA-GRPO trainer and the SFT warm start

Data flows one way:
    Task -> Env.reset -> (policy acts -> Env.step)* -> Trajectory -> reward -> advantages -> GRPO update
"""

__version__ = "0.1.0"
