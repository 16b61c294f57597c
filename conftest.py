"""Repository-wide pytest setup.

Notebooks run under nbval in smoke mode: the kernels nbval starts inherit this
process's environment, so setting ``WORKBOOK_SMOKE=1`` here makes every notebook
take its short path (see ``helpers.notebook.SMOKE``). ``setdefault`` lets a person
run the full notebooks under pytest with ``WORKBOOK_SMOKE=0 pytest notebooks/``.
"""

import os

os.environ.setdefault("WORKBOOK_SMOKE", "1")
