"""TrailEnv: walk six rooms by the signs, then answer the exit's code (the long-horizon tiny world, ``helpers.worlds.trail``).

An environment on TRL's contract (``helpers.envs.base``): ``reset(**row)`` reads the task's hidden
rooms and code, and one public method is the tool:

    go(door)    go through a door of the room you are in: the next room, "locked. <this room again>", or the exit's code

    env = make_env("trail", max_steps=9)
    env.reset(task)          # "Find the exit code. room 1: gold red blue. sign: red"
    env.step(format_tool_call("go", {"door": "red"}))     # -> "room 2: pink grey blue. sign: blue"
    env.step(format_tool_call("go", {"door": "pink"}))    # -> "locked. room 2: pink grey blue. sign: blue"  (still in room 2)
    ...
    env.step(format_tool_call("go", {"door": "gold"}))    # -> "exit: code 47"
    env.step("<answer>47</answer>")                        # answered, reward 1.0

A locked door leaves the agent where it was: the state is the room, and a wasted turn. The anchor
state of GiGPO's step groups (``helpers.envs.anchors``) is therefore the room the agent is in
(``current_room``): every turn taken in room 4, first try or third, by any episode of the task, is
in one step group.

Bad input: a door the room does not have gives ``error: no door 'x' in room 3`` (the agent stays);
a ``go`` after the exit gives ``error: you are at the exit: answer its code``.
"""

from __future__ import annotations

import re

from helpers.envs.anchors import register_anchor
from helpers.envs.registry import register_env
from helpers.worlds.trail.tasks import describe


class TrailEnv:
    """Six rooms, one door in each that opens (the sign's); the exit's code is the answer.

    A task's row must carry ``rooms`` (each ``{"doors": [...], "sign": ...}``) and ``code``, as
    ``helpers.worlds.trail.tasks.make_trail_tasks`` writes them in its metadata.
    """

    def __init__(self):
        self.rooms: list[dict] = []
        self.code = 0
        self.room = 1  # 1..len(rooms); len(rooms) + 1 is the exit

    def reset(self, **row) -> None:
        """Keep this task's rooms and code; start in room 1."""
        rooms, code = row.get("rooms"), row.get("code")
        if not isinstance(rooms, list) or not rooms or not all(isinstance(r, dict) and r.get("sign") in r.get("doors", ()) for r in rooms):
            raise ValueError(f"TrailEnv needs a row with 'rooms' (each {{'doors': [...], 'sign': one of them}}) and 'code'; got rooms={rooms!r}")
        self.rooms, self.code, self.room = rooms, code, 1
        return None

    def go(self, door: str) -> str:
        """Go through one door of the room you are in.

        Args:
            door: the door's colour, as the room lists it
        """
        if self.room > len(self.rooms):
            return "error: you are at the exit: answer its code"
        here = self.rooms[self.room - 1]
        door = str(door)  # the model may write a number or a list
        if door not in here["doors"]:
            return f"error: no door {door!r} in room {self.room}"
        if door != here["sign"]:
            return "locked. " + describe(self.room, here)
        self.room += 1
        return f"exit: code {self.code}" if self.room > len(self.rooms) else describe(self.room, self.rooms[self.room - 1])


ROOM = re.compile(r"\broom (\d+)\b")


def current_room(history: list[dict]) -> str:
    """The trail's anchor state: the room the agent is in after ``history`` ("room 4", or "exit"), read
    off the env's last reply that names one (room 1 before any). Every reply of ``go`` names the room the
    agent is left in; a reply that names none (a call that did not parse) left the agent where it was."""
    for message in reversed(history):
        if message["role"] == "tool":
            text = message.get("content") or ""
            if text.startswith("exit") or "at the exit" in text:
                return "exit"
            found = ROOM.search(text)
            if found:
                return f"room {found.group(1)}"
    return "room 1"


register_env("trail", TrailEnv)
register_anchor("trail", current_room)
