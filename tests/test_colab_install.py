"""Every notebook's install cell works as Colab runs it.

On Colab the first code cell clones the workbook, changes into the clone and installs it.
Here each notebook's cell runs in a real IPython kernel (so ``!`` and ``{REPO}`` behave as
on Colab) with:

* a stand-in ``google.colab`` module, so the cell takes its Colab branch;
* the clone URL pointed at a local clone of this repository (no network);
* a stand-in ``pip`` first on ``PATH`` that records where and how it was called, so the
  test neither downloads nor replaces this machine's install.

After the cell, ``import helpers`` must find the package inside the fresh clone, and pip
must have been asked for ``-e .`` from the clone's root. The cell runs twice, as a reader
re-running it would: the second run must not clone again or fail.
"""

import json
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers.paths import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPO_URL = "https://github.com/agentic-rl-workbook/agentic-rl-workbook"


def install_cell(path: Path) -> str:
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code" and "google.colab" in c.source]
    assert cells, f"{path.name} has no Colab install cell"
    assert REPO_URL in cells[0].source, f"{path.name}: the install cell does not clone {REPO_URL}"
    return cells[0].source


@pytest.fixture(scope="module")
def local_repo(tmp_path_factory) -> Path:
    """A bare clone of this checkout's HEAD: what `git clone` fetches (committed files only)."""
    bare = tmp_path_factory.mktemp("origin") / "agentic-rl-workbook.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(ROOT), str(bare)], check=True)
    return bare


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_install_cell_runs_as_on_colab(path, tmp_path, local_repo):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "pip-calls.jsonl"
    fake_pip = bin_dir / "pip"
    fake_pip.write_text(f"#!/usr/bin/env python3\nimport json, os, sys\n"
                        f"open({str(calls)!r}, 'a').write(json.dumps({{'cwd': os.getcwd(), 'args': sys.argv[1:]}}) + '\\n')\n")
    fake_pip.chmod(0o755)
    content = tmp_path / "content"  # Colab's working folder
    content.mkdir()

    setup = (f"import os, sys, types\nsys.modules['google.colab'] = types.ModuleType('google.colab')\n"
             f"os.environ['PATH'] = {str(bin_dir)!r} + os.pathsep + os.environ['PATH']\nos.chdir({str(content)!r})")
    cell = install_cell(path).replace(REPO_URL, str(local_repo))
    check = "import helpers, os\nprint(os.path.realpath(helpers.__file__))\nprint(os.getcwd())"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (setup, cell, cell, check)])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()

    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.output_type == "error" or (o.output_type == "stream" and "not found" in o.text)]
    assert not errors, errors
    clone = (content / "agentic-rl-workbook").resolve()
    helpers_file, cwd = "".join(o.text for o in nb.cells[3].outputs if o.output_type == "stream").split()
    assert Path(helpers_file) == clone / "helpers" / "__init__.py"
    assert Path(cwd) == clone
    pip = [json.loads(line) for line in calls.read_text().splitlines()]
    assert pip and all(Path(c["cwd"]) == clone and c["args"][:3] == ["install", "-q", "-e"] for c in pip)
    # both runs of the cell installed the clone itself, with the extras the notebook needs
    assert len(pip) >= 2 and all(c["args"][3] == "." or c["args"][3].startswith(".[") for c in pip)
