"""The vLLM backend's calls, checked against a fake ``vllm`` module (no vLLM install needed).

These tests inject a stand-in into ``sys.modules`` that records what the adapter asks of
it and answers in vLLM's output shapes, on a pretend GPU or a pretend CPU platform. What
is checked: the LLM's constructor arguments (and what changes on CPU), the SamplingParams
mapping (one per prompt, seeds distinct), token-id prompts, log-prob extraction, a new
LoRARequest id and folder per adapter version, and the sleep/wake order. What is not:
vLLM itself; tests/test_vllm_engine.py runs the real CPU engine.
"""

import math
import sys
import types
from dataclasses import dataclass, field

import pytest

from helpers.config import get_preset
from helpers.policy.base import SamplingParams


@dataclass
class FakeLogprob:
    logprob: float
    rank: int = 1


@dataclass
class FakeCompletion:
    token_ids: list
    logprobs: list
    finish_reason: str


@dataclass
class FakeRequestOutput:
    prompt_token_ids: list
    outputs: list


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeLLM:
    """Answers prompt i with tokens [100 + i, 101 + i] (+ a stop token 7 if asked), log-prob -(k + 1) / 10."""

    instances = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []  # ("generate" | "sleep" | "wake_up" | "reset_prefix_cache", details)
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        return "fake-tokenizer"

    def generate(self, prompts, sampling_params, lora_request=None, use_tqdm=True):
        self.calls.append(("generate", dict(prompts=prompts, params=sampling_params, lora=lora_request)))
        outs = []
        for i, (prompt, sp) in enumerate(zip(prompts, sampling_params)):
            tokens = [100 + i, 101 + i] + ([7] if 7 in sp.stop_token_ids else [])
            # a dict per position holding the sampled token and one alternative, as with logprobs=1
            steps = [{tok: FakeLogprob(-(k + 1) / 10), 99999: FakeLogprob(-5.0, 2)} for k, tok in enumerate(tokens)]
            outs.append(FakeRequestOutput(prompt["prompt_token_ids"], [FakeCompletion(tokens, steps, "stop" if 7 in tokens else "length")]))
        return outs

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache", None))


@dataclass
class FakePlatform:
    device_name: str = "cuda"

    def is_cpu(self):
        return self.device_name == "cpu"

    def is_sleep_mode_available(self):
        return self.device_name == "cuda"


def install_fake_vllm(monkeypatch, device: str):
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, FakeSamplingParams
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = FakePlatform(device)
    for name, module in [("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request), ("vllm.platforms", platforms)]:
        monkeypatch.setitem(sys.modules, name, module)
    FakeLLM.instances.clear()
    return vllm


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM on a (pretend) CUDA GPU."""
    return install_fake_vllm(monkeypatch, "cuda")


@pytest.fixture
def fake_vllm_cpu(monkeypatch):
    """vLLM's CPU build (pretend)."""
    return install_fake_vllm(monkeypatch, "cpu")


@dataclass
class FakePeftModel:
    saved: list = field(default_factory=list)
    peft_config: dict = field(default_factory=lambda: {"default": None})  # what marks a peft model

    def save_pretrained(self, path):
        from pathlib import Path

        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_config.json").write_text("{}")
        self.saved.append(path)


def make_policy(tmp_path, **overrides):
    from helpers.policy.vllm import VLLMPolicy

    return VLLMPolicy.from_config(get_preset("gsm8k-24gb", **overrides), adapter_dir=tmp_path / "adapters")


def test_import_without_vllm_is_fine_and_use_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes "import vllm" raise ImportError
    from helpers.policy.vllm import VLLMPolicy  # importing the module must not need vllm

    with pytest.raises(ImportError, match="pip install"):
        VLLMPolicy("Qwen/Qwen2.5-1.5B-Instruct")


def test_llm_is_built_from_the_preset(fake_vllm, tmp_path):
    policy = make_policy(tmp_path)
    kwargs = FakeLLM.instances[-1].kwargs
    config = get_preset("gsm8k-24gb")
    assert kwargs["model"] == config.model and kwargs["dtype"] == "bfloat16"
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == config.lora_r == 32
    assert kwargs["gpu_memory_utilization"] == config.vllm_gpu_memory_utilization
    assert kwargs["enable_sleep_mode"] is True
    assert kwargs["max_model_len"] == config.max_total_tokens
    assert kwargs["logprobs_mode"] == "processed_logprobs"  # after temperature, as HFPolicy (helpers.policy.base)
    assert "kv_cache_memory_bytes" not in kwargs and "enable_chunked_prefill" not in kwargs  # CPU only
    assert policy.tokenizer == "fake-tokenizer"  # vLLM's own when none is given
    assert policy.lora_request is None  # base model until the first update


def test_sampling_params_mapping_and_distinct_seeds(fake_vllm, tmp_path):
    policy = make_policy(tmp_path)
    params = SamplingParams(max_new_tokens=512, temperature=0.7, top_p=0.9, stop_token_ids=[7, 8], seed=3)
    with pytest.warns(UserWarning, match="nucleus"):  # top_p < 1: vLLM's log-probs are over the nucleus, not the vocabulary
        sps = policy.sampling_params(params, prompt_lengths=[100, 100, 200, 700])
    assert len(sps) == 4
    for i, sp in enumerate(sps):
        assert (sp.temperature, sp.top_p, sp.stop_token_ids) == (0.7, 0.9, [7, 8])
        assert sp.logprobs == 0 and sp.n == 1
        assert sp.seed == 3 + i  # G samples of one task must not share a seed
    # max_model_len is the preset's 768-token budget: a 700-token prompt has room for 68
    assert [sp.max_tokens for sp in sps] == [512, 512, 512, 68]
    assert all(sp.seed is None for sp in policy.sampling_params(SamplingParams(), [1, 1]))


def test_generate_passes_token_ids_and_extracts_logprobs(fake_vllm, tmp_path):
    policy = make_policy(tmp_path)
    prompts = [[1, 2, 3], [4, 5]]
    gens = policy.generate(prompts, SamplingParams(max_new_tokens=8, stop_token_ids=[7]))
    call = FakeLLM.instances[-1].calls[-1]
    assert call[0] == "generate"
    assert call[1]["prompts"] == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}]
    assert [g.token_ids for g in gens] == [[100, 101, 7], [101, 102, 7]]
    for g in gens:  # the sampled token's log-prob, not the alternative's
        assert all(math.isclose(a, b) for a, b in zip(g.logprobs, [-0.1, -0.2, -0.3]))
        assert g.finish_reason == "stop"
    no_stop = policy.generate([[1]], SamplingParams(max_new_tokens=2))
    assert no_stop[0].finish_reason == "length" and len(no_stop[0].logprobs) == 2
    assert policy.generate([], SamplingParams()) == []


def test_each_adapter_version_gets_a_new_id_and_folder(fake_vllm, tmp_path):
    policy = make_policy(tmp_path)
    model = FakePeftModel()
    policy.sync(model)
    first = policy.lora_request
    assert (first.lora_int_id, first.lora_name) == (1, "policy-v1")
    assert first.lora_path == str(tmp_path / "adapters" / "v1")
    policy.sync(model)
    second = policy.lora_request
    assert second.lora_int_id == 2 and second.lora_path == str(tmp_path / "adapters" / "v2")
    assert not (tmp_path / "adapters" / "v1").exists()  # the old version's folder is cleaned up
    calls = FakeLLM.instances[-1].calls
    policy.generate([[1]], SamplingParams(max_new_tokens=2))
    assert calls[-1][1]["lora"] is second  # sampling uses the newest adapter
    assert [c for c, _ in calls] == ["reset_prefix_cache", "generate"]  # stale prefix KV dropped once, before sampling


def test_a_base_model_is_sampled_without_an_adapter(fake_vllm, tmp_path):
    """helpers.evaluate without --adapter hands vLLM the base model: no adapter folder, no LoRARequest."""
    policy = make_policy(tmp_path)
    policy.sync(FakePeftModel())
    policy.sync(object())  # a transformers model without peft_config
    assert policy.lora_request is None and not (tmp_path / "adapters" / "v1").exists()  # the adapter's folder is gone
    policy.generate([[1]], SamplingParams(max_new_tokens=2))
    assert FakeLLM.instances[-1].calls[-1][1]["lora"] is None


def test_load_adapter_from_a_saved_folder(fake_vllm, tmp_path):
    policy = make_policy(tmp_path)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        policy.load_adapter(tmp_path)
    saved = tmp_path / "my_adapter"
    FakePeftModel().save_pretrained(saved)
    policy.load_adapter(saved)
    assert policy.lora_request.lora_path == str(saved) and policy.lora_request.lora_int_id == 1


def test_sleep_then_generate_wakes_first(fake_vllm, tmp_path):
    policy = make_policy(tmp_path)
    policy.sleep()
    policy.sleep()  # idempotent
    policy.generate([[1]], SamplingParams(max_new_tokens=2))
    names = [c for c, _ in FakeLLM.instances[-1].calls]
    assert names == ["sleep", "wake_up", "generate"]
    assert FakeLLM.instances[-1].calls[0][1] == 1  # level 1: base weights kept in CPU RAM


def test_one_training_step_order(fake_vllm, tmp_path):
    """What helpers.train does per step: sample, sleep, update, sync the adapter, sample again."""
    policy = make_policy(tmp_path)
    policy.generate([[1]], SamplingParams(max_new_tokens=2))
    policy.sleep()
    policy.sync(FakePeftModel())  # while asleep: only the folder and the request change
    policy.generate([[1]], SamplingParams(max_new_tokens=2))
    names = [c for c, _ in FakeLLM.instances[-1].calls]
    assert names == ["generate", "sleep", "wake_up", "reset_prefix_cache", "generate"]


def test_t4_preset_samples_in_float16(fake_vllm, tmp_path):
    from helpers.policy.vllm import VLLMPolicy

    VLLMPolicy.from_config(get_preset("gsm8k-t4"), adapter_dir=tmp_path)
    assert FakeLLM.instances[-1].kwargs["dtype"] == "float16"  # the trainer runs in float32


def test_no_sleep_mode_never_sleeps(fake_vllm, tmp_path):
    policy = make_policy(tmp_path, vllm_sleep_mode=False)
    policy.sleep()
    policy.generate([[1]], SamplingParams(max_new_tokens=2))
    assert [c for c, _ in FakeLLM.instances[-1].calls] == ["generate"]


def test_cpu_no_sleep_mode_explicit_kv_cache_and_no_chunked_prefill(fake_vllm_cpu, tmp_path, capsys):
    """On CPU: sleep mode off (vLLM refuses it there), a KV cache sized for one rollout batch
    instead of a share of host RAM, and no chunked prefill (it kills the CPU engine when
    requests have seeds); each request keeps its own seed, as on a GPU."""
    config = get_preset("tiny-cpu", backend="vllm")
    policy = make_policy(tmp_path, **{f: getattr(config, f) for f in ("model", "dtype", "lora_r", "max_total_tokens",
                                                                       "tasks_per_step", "num_generations", "vllm_dtype")})
    kwargs = FakeLLM.instances[-1].kwargs
    assert "sleep mode is not supported" in capsys.readouterr().out
    assert kwargs["enable_sleep_mode"] is False and "gpu_memory_utilization" not in kwargs
    # tiny model: 2 (K, V) x 4 layers x 4 heads x 32 dims x 4 bytes = 4 KiB a token, for 64 sequences x 192 tokens
    assert kwargs["kv_cache_memory_bytes"] == 4096 * 192 * 64
    assert kwargs["enable_chunked_prefill"] is False and kwargs["max_num_batched_tokens"] == 192 * 64
    assert kwargs["enforce_eager"] is True
    policy.generate([[1], [1]], SamplingParams(max_new_tokens=2, seed=5))
    assert [sp.seed for sp in FakeLLM.instances[-1].calls[-1][1]["params"]] == [5, 6]
    policy.sleep()
    assert [c for c, _ in FakeLLM.instances[-1].calls] == ["generate"]  # sleep is a no-op


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_torch_jit_hides_torchs_deprecation_of_its_own_mkldnn_module(quiet):
    """vLLM's engine start imports ``torch.utils.mkldnn``, whose ``torch.jit.script_method`` torch 2.13 deprecates:
    14 DeprecationWarnings in a pytest run of tests/test_vllm_engine.py alone. Without the context the import must
    warn (else the context has nothing left to hide and should go); with it, nothing."""
    import subprocess

    body = "    import torch.utils.mkldnn"
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "from helpers.policy.vllm import quiet_torch_jit\n" + ("with quiet_torch_jit():\n" if quiet else "if True:\n") + body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if quiet:
        assert out.returncode == 0, out.stderr[-2000:]
    else:
        assert out.returncode != 0 and "torch.jit.script_method" in out.stderr, out.stderr[-2000:]
