"""The GAIA world: GAIA's 165 validation questions (a gated dataset), scored by GAIA's own leaderboard scorer.

GAIA (Mialon et al. 2023, "GAIA: a benchmark for General AI Assistants") asks questions that are
simple for a person with a browser and a computer and hard for a model alone; each has one short
answer, checked by a normalising scorer rather than by a judge model. This world plugs it into the
workbook's registries:

    tasks.py    the datasets "gaia" and "gaia/2023_level{1,2,3}" (test split = GAIA's validation), from the
                hub with the user's token (or a local copy, GAIA_DATASET); without access, one error that says what to do
    scorer.py   question_scorer, the leaderboard's: numbers, comma/semicolon lists element by element, strings
    env.py      GaiaEnv ("gaia"): one turn, no tools, GAIA's scorer as the reward; the benchmark "gaia"

    python -m helpers.evaluate --benchmark gaia --answers answers.jsonl       # a file of final answers, no model
    python -m helpers.evaluate --benchmark gaia --preset gsm8k-24gb           # a model, from what it knows (GPU)

GAIA needs a Hugging Face token and GAIA's terms accepted on its dataset page; most GAIA tasks need tools
the workbook does not have: web browsing and search (most Level 2 and 3 questions), reading the attached
files (spreadsheets, PDFs, images, audio, code: the questions with a file_name), and running code, so here
a model answers without them and its GAIA score is a floor.

Importing this world reads nothing: the dataset is fetched where a task is loaded.
"""

from helpers.worlds.gaia import env, tasks  # noqa: F401  (register the datasets, the env and the benchmark)
