"""The multi-step tiny world (多步小世界): a shop where every answer hides behind three tools.

Where the one-call world (``helpers.worlds.arithmetic``) asks the agent to copy a question into the
calculator, here it has to *plan* a chain of calls, each built from the one before: find
what the customer buys (``usual``), look that item's price up (``lookup``), multiply it
out (``calculator``), and answer with what the calculator said. What the customer buys and
what every item costs are drawn per task (``task.metadata``, read only by the env), so
nothing can be memorised; ``ShopEnv`` (``env.py``) is the env. One episode, in the
tiny tokenizer's chat format (the Qwen2.5 tool format):

    <|im_start|>system\\nFind the customer's item, look up its price, then use the calculator. Answer as <answer>N</answer>.\\nTools: usual(), lookup(item), calculator(expression)<|im_end|>\\n
    <|im_start|>user\\nWhat do 3 of my usual items cost?<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "usual", "arguments": {}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{"item": "pen"}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "lookup", "arguments": {"item": "pen"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n47\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": "calculator", "arguments": {"expression": "3*47"}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n141\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<answer>141</answer><|im_end|>\\n

Four turns, three tool calls, three tools; the second call's argument is the first call's
result, the third's is built from the second's and the question, and the answer is the third's.

The warm start is a *weak* agent, for the reasons real agents are weak: its SFT
demonstrations come from a sloppy demonstrator with habits (``HABITS``, keyed on the item
the customer buys): for 9 items in 12, most of the time, it guesses the price instead of
looking it up, stops at the unit price, or asks ``lookup`` (not the calculator) for the
bill and gives up; and now and then, for any item, it makes one of those slips
(``SLIP_RATE``). The SFT model imitates the mixture, so greedy decoding follows the habits
and fails on most tasks, and sampling finds the right plan often enough for GRPO to learn
from the outcome alone (``rewards={"correct": 1.0}``, no bonus for tool calls).

The warm start succeeds on about a quarter of the held-out tasks (``data/tiny-agent/baseline.json``);
GRPO on the outcome alone teaches it the plan (notebook 06).

The world's files:

    env.py      ShopEnv ("shop"): TRL's environment contract, tools usual(), lookup(item), calculator(expression)
    tasks.py    the tasks (dataset "tiny-agent"): what the customer buys and every price, hidden in the task
    presets.py  tiny-agent: GRPO on the shop world on a CPU
    build.py    the warm start data/tiny-agent (python -m helpers.worlds.shop build), failure kinds

    tasks = make_agent_tasks(64, seed=0, split="test")    # or load_dataset("tiny-agent", "test", 64)
    model, tokenizer = load_tiny("data/tiny-agent")
    python -m helpers.train --preset tiny-agent --seed 0  # GRPO: the agent learns the plan

Simplifications, named:

* One question shape (quantities 2-9, prices 10-99, a three-digit bill), so every canonical
  episode has the same length in tokens.
* ``usual()`` takes no argument: it knows who is asking, as a real API knows the logged-in
  user (a customer's name to copy into the first call was more than the tiny model learnt to copy).
* Why a chain and not "3 pens and 2 cups" (two lookups, then one sum): every value the
  agent copies here comes from the tool result just before it (or the question), which a
  small transformer learns to copy; copying the *second-to-last* result, or picking the
  *second* item off a question, is what the tiny model did not learn in a short SFT.
* The split is by what decides the answer (quantity, item, price), not by the question's
  text, which is the same for every task with the same quantity.
* The model starts from the one-call world's weights (``warm_start``), as a real agent
  starts from a pretrained model.
* The demonstrator's habits are keyed on the item; a real agent's weaknesses have
  messier causes.
* The tokenizer training, the chat template, the model's shape and the SFT loop are the
  one-call world's (``helpers.worlds.tinymodel``, ``helpers.sft``); only the tasks (and so the
  vocabulary) differ.

The tiny chat template lists the tools in one fixed order whatever order the caller passes them in
(``helpers.worlds.tinymodel.CHAT_TEMPLATE``), so the prompt is the same text in this workbook's loop
and in TRL's ``GRPOTrainer``, and the one the warm start was trained on.
"""

from helpers.worlds.shop import env, presets, tasks  # noqa: F401  (register "shop", "tiny-agent" and the preset)
