"""Policies (采样模块): what the rollout asks for the next assistant turn.

    from helpers.policy import HFPolicy, SamplingParams
    policy = HFPolicy(model, tokenizer)                 # transformers, CPU or GPU
    policy = VLLMPolicy(...)                            # helpers.policy.vllm, GPU only (imported lazily)
"""

from helpers.policy.base import Generation, Policy, SamplingParams, ScriptedPolicy
from helpers.policy.hf import HFPolicy

__all__ = ["Generation", "HFPolicy", "Policy", "SamplingParams", "ScriptedPolicy"]
