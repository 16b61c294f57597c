"""Policies (采样模块): what the rollout asks for the next assistant turn.

    from helpers.policy import HFPolicy, SamplingParams, load_model, make_policy
    model, tokenizer = load_model(config)               # a local folder (data/tiny) or a hub id
    policy = make_policy(config, model, tokenizer)      # config.backend: "hf", "engine" or "vllm"
    trained = load_adapter(model, "runs/.../checkpoint-50")  # a run's trained LoRA adapter on the base model
    policy = HFPolicy(model, tokenizer)                 # transformers, CPU or GPU: the textbook sampler
    policy = EnginePolicy(model, tokenizer)             # helpers.policy.engine: merged weights, KV cache across turns
    policy = VLLMPolicy.from_config(config, tokenizer)  # helpers.policy.vllm (vllm itself is imported when it starts)
"""

import warnings
from contextlib import contextmanager

import torch

from helpers.config import BACKENDS, TrainConfig
from helpers.paths import ROOT
from helpers.policy.base import Generation, Policy, SamplingParams, ScriptedPolicy
from helpers.policy.engine import EnginePolicy
from helpers.policy.hf import HFPolicy
from helpers.policy.vllm import VLLMPolicy


def resolve_device(name: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is visible, else ``"cpu"``; any other name as it is."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class ModelUnavailable(OSError):
    """A hub model that did not load (an id with a typo, the hub out of reach and no copy in the cache), in one line
    that names the model: transformers' own OSError comes as a long traceback from deep inside its hub code."""


def load_model(config: TrainConfig):
    """``(model, tokenizer)`` from a local folder (relative to the repo root) or a hub id, in ``config.dtype``.

    Raises ``ModelUnavailable`` when a hub id does not load; a local folder's errors are left as they are."""
    # transformers' auto classes are imported where a model loads: they pull in torch.distributed and sympy,
    # which a command's refusals should not wait for
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = ROOT / config.model
    source = str(local) if local.exists() else config.model
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, config.dtype))
        return model, AutoTokenizer.from_pretrained(source)
    except OSError as e:
        if local.exists():  # a local folder's own error (a missing file) already names the file
            raise
        message = str(e).strip()
        reason = message.splitlines()[0] if message else type(e).__name__
        raise ModelUnavailable(f"model {config.model}: not a folder under {ROOT}, and the Hugging Face Hub did not give it "
                               f"({reason}); check the id and the connection") from e


@contextmanager
def quiet_peft():
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model: a
    FutureWarning that is noise, not news, to the reader. Silenced here, and only that one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def load_adapter(model, adapter_dir):
    """``model`` with a trained LoRA adapter on it (a run's ``checkpoint-<step>`` folder), in eval mode."""
    from peft import PeftModel  # peft is imported where an adapter is handled: a command's refusals need none

    with quiet_peft():
        return PeftModel.from_pretrained(model, adapter_dir).eval()


def make_policy(config: TrainConfig, model, tokenizer) -> Policy:
    """The rollout backend of ``config.backend``: transformers on ``model`` itself; the workbook's
    engine on a merged copy of ``model``'s weights; or a vLLM engine on the same weights that starts
    from ``model``'s adapter (its B = 0 at the start of a run: the base model's outputs). The last two
    take the updated adapter at each ``sync(model)``."""
    if config.backend == "engine":
        return EnginePolicy(model, tokenizer)
    if config.backend == "vllm":
        policy = VLLMPolicy.from_config(config, tokenizer)
        policy.sync(model)
        return policy
    return HFPolicy(model, tokenizer)  # "hf" (TrainConfig checks the name)


__all__ = ["BACKENDS", "EnginePolicy", "VLLMPolicy", "Generation", "HFPolicy", "Policy", "SamplingParams", "ScriptedPolicy", "load_adapter", "load_model",
           "make_policy", "quiet_peft", "resolve_device"]
