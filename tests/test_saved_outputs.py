"""The saved outputs of the notebooks agree with the shipped artifacts and the code.

The notebooks are stored with the outputs of one full CPU run; a reader trusts them. These
tests read the .ipynb JSON (no kernel, no model load: well under a second) and check a few
facts a stale output would get wrong, and that no saved output carries noise the code
silences at its source.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import pytest

from helpers.config import get_preset
from helpers.paths import ROOT, TINY_DIR

NOTEBOOKS = ROOT / "notebooks"
# Text that must never be in a saved output: math-verify's timeout lines, deprecation noise, and
# a tqdm bar frozen at 0% (a progress widget rendered statically).
NOISE = ("Timeout is disabled", "FutureWarning", "0%|")


def outputs(path: Path) -> list[tuple[int, str]]:
    """(cell index, text) of every text output of a notebook: streams, results, errors."""
    found = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                found.append((i, "".join(out["text"])))
            elif out["output_type"] in ("execute_result", "display_data"):
                found.append((i, "".join(out["data"].get("text/plain", ""))))
            elif out["output_type"] == "error":
                found.append((i, f"{out['ename']}: {out['evalue']}"))
    return found


def all_output_text(name: str) -> str:
    return "\n".join(text for _, text in outputs(NOTEBOOKS / name))


def shipped_parameter_count() -> int:
    """Parameters of data/tiny, read from the safetensors header (each tensor once, as model.parameters())."""
    with open(TINY_DIR / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")


def test_trainer_notebook_prints_the_shipped_parameter_count():
    text = all_output_text("05_trainer.ipynb")
    printed = [int(n) for n in re.findall(r"'parameters': (\d+)", text)]  # the scratch SFT build's baseline line
    assert printed, "05 should print the parameter count of its SFT build"
    baseline = json.loads((TINY_DIR / "baseline.json").read_text())["parameters"]
    assert printed == [shipped_parameter_count()] == [baseline]


def test_trainer_notebook_memory_sentence_matches_its_table():
    text = all_output_text("05_trainer.ipynb")
    lora = re.search(r"GRPO, LoRA \(reference = adapter off\)\s+([\d.]+) GiB", text)
    ppo = re.search(r"PPO, full fine-tune \(\+ reference \+ critic\)\s+([\d.]+) GiB", text)
    assert lora and ppo, "05's memory table is missing from its outputs"
    cells = json.loads((NOTEBOOKS / "05_trainer.ipynb").read_text(encoding="utf-8"))["cells"]
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert f"{lora[1]} GiB for GRPO with LoRA against {ppo[1]} GiB" in prose


def test_pitfalls_notebook_states_the_preset_learning_rate():
    text = all_output_text("08_pitfalls.ipynb")
    stated = re.search(r"tiny-cpu preset learning rate: ([0-9.e-]+); sweep: \[([^\]]*)\]", text)
    assert stated, "08 should print the tiny-cpu preset's learning rate"
    lr = get_preset("tiny-cpu").lr
    assert float(stated[1]) == lr
    assert lr in [float(x.strip(" '")) for x in stated[2].split(",")], "the sweep must include the preset's rate"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")), ids=lambda p: p.name)
def test_no_noise_in_saved_outputs(path):
    noisy = [(i, bad) for i, text in outputs(path) for bad in NOISE if bad in text]
    assert not noisy, f"{path.name}: saved outputs contain {noisy} (cell index, text); silence it at its source and re-run"


CHINESE_NAMES = {"00": "总览", "01": "数据模块", "02": "环境模块", "03": "采样模块", "04": "奖励模块", "05": "训练模块",
                 "06": "完整训练循环", "07": "GSM8K 实战", "08": "常见陷阱", "09": "自我博弈", "10": "环境市场", "11": "持续学习",
                 "06b": "轨迹优化"}  # notebook 00's map; the key is the number before the name's first "_"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")), ids=lambda p: p.name)
def test_title_carries_the_chinese_name_of_the_map(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    title = "".join(cells[0]["source"]).splitlines()[0]
    name = CHINESE_NAMES[path.name.split("_")[0]]
    assert name in title, f"{path.name}: title {title!r} should carry {name!r} (notebook 00's map)"
    number = path.name.split("_")[0]
    assert re.fullmatch(rf"# {number} · [^·—()]+ — {re.escape(name)}[^·—()]*", title), (
        f"{path.name}: title {title!r} should read '# {number} · English name — {name}...' (one form for every notebook)")
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "要点" in prose, f"{path.name}: no 要点 (key points) cell"
