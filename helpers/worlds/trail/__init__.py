"""The long-horizon tiny world (长程小世界): a trail of six rooms, where turn-level credit has something to find.

Each room has three doors and a sign naming the one that opens; the agent calls ``go(door)`` once
per room and, at the exit, answers the code it read there. Seven decisions at least, a few turns to
spare, and the outcome reward only at the end (``rewards={"correct": 1.0}``). One episode, in the
tiny tokenizer's chat format:

    system  In each room go through the door the sign names. At the exit answer its code as <answer>N</answer>.
    user    Find the exit code. room 1: gold red blue. sign: red
    go(red)   -> room 2: pink grey blue. sign: blue
    go(blue)  -> room 3: ...
    go(gold)  -> locked. room 4: gold pink blue. sign: pink        (the habit: the first door; still in room 4)
    go(pink)  -> room 5: ...
    ...       -> exit: code 47
    <answer>47</answer>

Why GiGPO should help here and not in the shop (notebook 06b §4): the warm start's weakness is one
decision in the middle. Its demonstrator follows the signs, but in room 4 it tries the first door
listed, most of the time, whatever the sign says and however often that door was locked; greedy
decoding loops there until the turns or the tokens run out. A locked door leaves the agent in the
same room, so the episodes of a group pass through the same states again and again, and GiGPO's
anchor state for this world is the room (``env.current_room``): every try in room 4, first or third,
of any episode of the task, is one step group, judged by its discounted return. In a group whose
episodes all end right, some after a locked try, GRPO's advantages are all zero; the step group
still ranks the right door (one turn closer to the reward, so gamma^k more) above the locked tries.

The world's files:

    env.py      TrailEnv ("trail"): go(door); the anchor state current_room
    tasks.py    the trails (dataset "tiny-trail"): doors, signs and the exit code, hidden in the task
    presets.py  tiny-long-horizon: GRPO or GiGPO on the trail on a CPU
    build.py    the warm start data/tiny-trail (python -m helpers.worlds.trail build), failure kinds

Simplifications, named: the trail is a line (no branches to explore, only doors to choose); the
room number and the sign are in every reply, so the state is fully observed; the demonstrator's
habit is keyed on the room number, a real agent's weaknesses have messier causes; the model starts
from the one-call world's weights (``warm_start``), as the shop's does.
"""

from helpers.worlds.trail import env, presets, tasks  # noqa: F401  (register "trail", "tiny-trail" and the preset)
