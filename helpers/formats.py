"""What the text looks like: the answer tag, the tool-call format, number parsing.

Every module that reads model output (environments, rewards, evaluation) goes
through these functions, so "what counts as an answer" is decided in one place.

Formats (the same for the tiny model and for Qwen2.5-Instruct):

    final answer   <answer>42</answer>                        (strict format)
    tool call      <tool_call>
                   {"name": "calculator", "arguments": {"expression": "6*7"}}
                   </tool_call>                                (Qwen2.5's own format)
    tool result    a message with role "tool"; Qwen's chat template renders it as
                   <tool_response>\n42\n</tool_response> inside a user turn.

Lenient answer extraction (used for GSM8K-style checking) falls back from the
tag to ``\\boxed{...}``, to ``#### N``, to the last number in the text, and says
which rule fired, so a run can report strict-format and lenient accuracy apart.
``judge_answer`` is the one verdict on an answer (environments and rewards both call it).

Every function here reads model output, so each takes any string and never raises on
it, in time linear in its length: tags are found with ``str.find`` (a regex like
``<tool_call>(.*?)</tool_call>`` rescans the rest of the text from every unclosed
tag: quadratic in the text's length), numbers longer than
``MAX_NUMBER_CHARS`` are not numbers we compare, and a tool call's JSON may be huge or
deeply nested and still only becomes an error message. That is how the step timeout of
an env "covers" parsing: parsing is fast by construction, so it needs no timer.

The one judgement that is not fast by construction is math-verify's symbolic check
(an answer like ``1/2`` against ``0.5``): sympy computes what it is given, and a short
answer can cost without bound: ``10^{10^{7}}``, ``(10^{6})!`` or ``9^{9^{9}}`` take seconds
to minutes, holding the GIL all along, so no thread timer could cut them. A list of refused shapes cannot be complete (powers, factorials,
binomials, roots...), so the check runs in a worker process that is killed at
``MATH_VERIFY_SECONDS``: the verdict is then ``"check_timeout"``, counted as wrong. The
cut costs the limit plus a restart of the worker.

Text written by users, datasets and tools stays text (``encode_chat``): a question holding
``<|im_end|>\n<|im_start|>assistant`` is tokenised as those characters, never as the chat
template's control tokens, so it cannot end its own turn or forge another one.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

ANSWER_INSTRUCTION = (
    "Think step by step, then write the final answer as a number inside "
    f"{ANSWER_OPEN}{ANSWER_CLOSE} tags, for example {ANSWER_OPEN}42{ANSWER_CLOSE}."
)

_NUMBER = r"-?\$?\s?\d(?:[\d,]*\d)?(?:\.\d+)?%?|-?\$?\.\d+%?"  # a number never ends in a comma: "42, so"
_NUMBER_RE = re.compile(_NUMBER)
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_HASH_RE = re.compile(r"####\s*(" + _NUMBER + r")")
_FENCE = "```"
_FENCE_OPEN_RE = re.compile(r"```(?:python|py)?[ \t]*\n")  # a block opens: ```, ```py or ```python, then a newline
MAX_NUMBER_CHARS = 1000  # a longer "number" is not compared (int() of 4,300+ digits raises, and no answer is that long)
MATH_VERIFY_MAX_CHARS = 100  # longer "answers" are not sent to sympy (parsing can be slow)
MATH_VERIFY_SECONDS = 2.0  # a symbolic check still running after this is cut: verdict "check_timeout"


def between(text: str, open_tag: str, close_tag: str) -> list[str]:
    """The text inside every ``open_tag ... close_tag`` pair, in order (nearest close wins).

    One left-to-right pass with ``str.find``: linear in ``len(text)``. Once an open tag
    has no close after it, no later one has either, so the scan stops there.
    """
    found, pos = [], 0
    while (start := text.find(open_tag, pos)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        found.append(text[start + len(open_tag) : end])
        pos = end + len(close_tag)
    return found


def code_blocks(text: str) -> list[str]:
    """The body of every fenced code block (```` ``` ````, ```` ```py ```` or ```` ```python ````, up to the next
    ```` ``` ````), linear time."""
    blocks, pos = [], 0
    while (start := text.find(_FENCE, pos)) >= 0:
        opener = _FENCE_OPEN_RE.match(text, start)
        if opener is None:  # a fence that opens nothing (```` ```js ````, or a stray one): look further
            pos = start + 1
            continue
        end = text.find(_FENCE, opener.end())
        if end < 0:
            break
        blocks.append(text[opener.end() : end])
        pos = end + len(_FENCE)
    return blocks


def to_number(text: str | None) -> Fraction | None:
    """Parse a written number to an exact Fraction, or None if it is not one.

    Lenient about how people and models write numbers:
    ``"1,000"``, ``"$1000.00"``, ``"1000."``, ``" -3 "``, ``"12.5%"`` (-> 12.5),
    ``"\\boxed{1000}"``. Exact fractions avoid float surprises (0.1 + 0.2).

    >>> to_number("$1,000.00") == 1000
    True
    >>> to_number("-0.5") == Fraction(-1, 2)
    True
    >>> to_number("twelve") is None
    True
    """
    if text is None or len(text) > MAX_NUMBER_CHARS:
        return None
    s = text.strip()
    boxed = _BOXED_RE.fullmatch(s)
    if boxed:
        s = boxed.group(1).strip()
    s = s.replace("\\$", "$").replace("\\%", "%").rstrip(".").strip()
    s = s.replace(" ", "")
    s = s.replace("$-", "-$")  # "$-5" and "-$5" are the same number
    negative = s.startswith("-")
    s = s.lstrip("-").lstrip("$").rstrip("%")
    if not re.fullmatch(r"(\d{1,3}(,\d{3})+|\d+)(\.\d+)?|\.\d+", s):
        return None
    value = Fraction(s.replace(",", ""))
    return -value if negative else value


def format_number(value: Fraction) -> str:
    """Canonical text of a number: ``1000``, ``-3``, ``2.5`` (no commas, no trailing zeros).

    A non-integer is rounded to 10 decimals, exactly (``1/3`` -> ``0.3333333333``): in
    integers, not through a float, which overflows past 1e308 (an answer of 400 digits
    and ``.5``) and is not exact.
    """
    if value.denominator == 1:
        return str(value.numerator)
    whole, decimals = divmod(round(abs(value) * 10**10), 10**10)
    text = f"{whole}.{decimals:010d}".rstrip("0").rstrip(".")
    return "-" + text if value < 0 and text != "0" else text


@dataclass
class ExtractedAnswer:
    """An answer found in model output: its text, its value and the rule that found it.

    ``how`` is one of ``"tag"`` (strict format), ``"boxed"``, ``"hash"``,
    ``"last_number"``, or ``"none"`` when nothing that looks like a number was found.
    """

    text: str | None
    value: Fraction | None
    how: str

    @property
    def strict(self) -> bool:
        return self.how == "tag"


def extract_answer(text: str, lenient: bool = True) -> ExtractedAnswer:
    """Find the final answer in a completion.

    Strict: the last ``<answer>...</answer>`` tag. Lenient (default) then tries
    the last ``\\boxed{}``, a GSM8K-style ``#### N`` line, and the last number.
    """
    tags = between(text, ANSWER_OPEN, ANSWER_CLOSE)
    if tags:
        answer = tags[-1].strip()
        return ExtractedAnswer(answer, to_number(answer), "tag")
    if not lenient:
        return ExtractedAnswer(None, None, "none")
    for how, regex in [("boxed", _BOXED_RE), ("hash", _HASH_RE)]:
        found = regex.findall(text)
        if found:
            answer = found[-1].strip()
            return ExtractedAnswer(answer, to_number(answer), how)
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        last = numbers[-1].strip()
        return ExtractedAnswer(last, to_number(last), "last_number")
    return ExtractedAnswer(None, None, "none")


def answers_match(predicted: Fraction | None, reference: Fraction | str | None, rel_tol: float = 1e-9) -> bool:
    """Numeric equality with a tiny relative tolerance (0.333333 vs 1/3 is not equal; 2.50 vs 2.5 is).

    The tolerance is 1e-9, not 1e-6: with 1e-6, 1,000,001 would "equal" a gold answer of 1,000,000."""
    if predicted is None or reference is None:
        return False
    if isinstance(reference, str):
        reference = to_number(reference)
        if reference is None:
            return False
    if predicted == reference:
        return True
    return abs(predicted - reference) <= rel_tol * max(1, abs(reference))


@dataclass
class ToolCall:
    """One parsed ``<tool_call>`` block. ``error`` is set (and name/arguments may be
    None) when the block is not valid JSON of the form {"name": str, "arguments": dict}
    (missing "arguments" reads as {}; an object written as a JSON string is decoded)."""

    name: str | None
    arguments: dict | None
    raw: str
    error: str | None = None


def tool_call_blocks(text: str) -> list[str]:
    """The raw text of every ``<tool_call>`` block, in order (linear time, nothing decoded yet)."""
    return between(text, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)


def parse_tool_call(raw: str) -> ToolCall:
    """One block's JSON as a ToolCall; anything wrong with it becomes ``ToolCall.error``, never an exception.

    ``ValueError`` covers JSON errors and integers of over 4,300 digits (Python's limit on
    ``int(str)``); ``RecursionError`` covers JSON nested a thousand levels deep.
    """
    try:
        obj = json.loads(raw.strip())
    except (ValueError, RecursionError) as e:
        why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply" if isinstance(e, RecursionError) else "a number with too many digits"
        return ToolCall(None, None, raw, f"malformed JSON in tool call: {why}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, None, raw, 'tool call needs {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            pass
    if not isinstance(args, dict):
        return ToolCall(obj["name"], None, raw, "tool call arguments must be a JSON object")
    return ToolCall(obj["name"], args, raw)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """All tool calls in an assistant message, in order. Never raises on bad JSON."""
    return [parse_tool_call(raw) for raw in tool_call_blocks(text)]


def format_tool_call(name: str, arguments: dict) -> str:
    """The text of one tool call exactly as Qwen2.5-Instruct writes it."""
    return f"{TOOL_CALL_OPEN}\n" + json.dumps({"name": name, "arguments": arguments}) + f"\n{TOOL_CALL_CLOSE}"


# --- the verdict on an answer ---------------------------------------------------------------------


# --- child processes end with the process that started them ---------------------------------------
# A helper process (the math-verify worker, a sandbox run) must not outlive us however we end: exit
# handlers do not run on SIGKILL, os._exit, or a notebook kernel killed on restart. The child runs
# ``parent_death_code`` first: on Linux it asks the kernel for SIGKILL when its parent ends
# (PR_SET_PDEATHSIG); elsewhere a thread polls the parent's pid. The kernel's signal is sent when the
# *thread* that started the child ends, so a long-lived child is started from a thread that lives as
# long as the process (``start_child``).
_PARENT_DEATH_CODE = r"""
import ctypes as _ctypes, os as _os, sys as _sys, threading as _threading, time as _time
if _sys.platform.startswith("linux"):
    try:
        _ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG (1), SIGKILL (9): the kernel kills us when the parent ends
    except (OSError, AttributeError):
        pass
if _os.getppid() != {parent}:  # it ended before the line above took effect
    _os._exit(1)
if {watchdog}:  # the portable fallback: poll the parent's pid (a thread; it cannot cut a long C call, the kernel's signal can)
    def _watch():
        while _os.getppid() == {parent}:
            _time.sleep(0.5)
        _os._exit(1)
    _threading.Thread(target=_watch, daemon=True).start()
for _name in [name for name in _sys.modules if name.split(".")[0] in ("ctypes", "_ctypes")]:
    del _sys.modules[_name]  # a program run after this imports ctypes itself (where an audit hook watches imports, it sees that)
del _ctypes, _os, _sys, _threading, _time
"""


def parent_death_code(watchdog: bool = True) -> str:
    """Python source a child runs first so that it ends when this process ends (see above);
    ``watchdog``: also poll our pid from a thread, where the kernel cannot be asked."""
    return _PARENT_DEATH_CODE.format(parent=os.getpid(), watchdog=watchdog)


_SPAWNER: list[ThreadPoolExecutor] = []  # one thread, alive as long as the process: long-lived children start there


def start_child(argv: list[str], **popen_options) -> subprocess.Popen:
    """``subprocess.Popen(argv, ...)`` from the spawner thread, so that a child which runs
    ``parent_death_code`` is not killed when the thread that asked for it ends (a retired thread pool's)."""
    if not _SPAWNER:
        _SPAWNER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="child-spawner"))
    return _SPAWNER[0].submit(subprocess.Popen, argv, **popen_options).result()


# The worker: math-verify in a process of its own, one JSON line in ([reference, answer]),
# one out (true/false). Its own memory is capped (RLIMIT_AS), so an answer like
# 2^{2^{40}} fails there with MemoryError instead of pushing the machine into swap; each check's
# CPU time is capped (RLIMIT_CPU, the check's seconds + 1), so even a worker whose parent could not
# cut it stops computing (SIGXCPU) soon after its limit; and it ends with its parent (above).
_MATH_VERIFY_WORKER = r"""
import json, resource, sys
from math_verify import parse, verify

def equal(reference, answer):
    try:
        gold, pred = parse(f"${reference}$", parsing_timeout=None), parse(f"${answer}$", parsing_timeout=None)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=None))
    except Exception:  # math-verify is a best-effort second opinion
        return False

equal("1/2", "0.5")  # the first check imports the rest of sympy: do it before we are timed
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
print("ready", flush=True)
for line in sys.stdin:
    reference, answer, seconds = json.loads(line)
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # CPU seconds so far, user + system
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = int(used + seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    print(json.dumps(equal(reference, answer)), flush=True)
"""


class _MathVerifyWorker:
    """One math-verify process shared by every thread; a check that runs too long kills it.

    Checks take turns (a lock): a thread waits for the ones before it, each at most
    ``MATH_VERIFY_SECONDS``, and the wait is not counted in its own time. Starting the
    worker (importing sympy) is not counted either; after a kill the next
    check starts a new one. The worker ends with us: at exit its stdin is closed and it is waited for, and
    however we end, the kernel (or its watchdog thread) ends it (``parent_death_code``).
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        atexit.register(self.close)

    def close(self) -> None:
        """End the worker, if one runs: its loop ends when its stdin closes."""
        with self.lock:
            if self.proc is not None:
                self._end(kill=False)

    def _end(self, kill: bool) -> None:
        """Stop the worker (``kill``: at once, it is still computing) and close its pipes; the next check starts another."""
        if kill:
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass  # a write it never read: the worker is gone either way
        try:
            self.proc.wait(timeout=MATH_VERIFY_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _start(self) -> subprocess.Popen:
        proc = start_child([sys.executable, "-c", parent_death_code() + _MATH_VERIFY_WORKER], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if proc.stdout.readline() != "ready\n":  # math-verify missing, or the import failed
            proc.kill()
            proc.wait()
            raise RuntimeError("the math-verify worker did not start (is math-verify installed?)")
        return proc

    def equal(self, reference: str, answer: str, seconds: float) -> bool | None:
        """math-verify's verdict on ``answer == reference``, or None when it ran past ``seconds`` (then killed)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            try:
                self.proc.stdin.write(json.dumps([reference, answer, seconds]) + "\n")
                self.proc.stdin.flush()
                if select.select([self.proc.stdout], [], [], seconds)[0]:
                    line = self.proc.stdout.readline()
                    if line:
                        return json.loads(line)
            except OSError:
                pass  # it died under us (killed from outside)
            self._end(kill=True)  # still computing (or it died, e.g. of its memory cap): a new worker next time
            return None


_math_verify = _MathVerifyWorker()


def judge_answer(text: str, reference: str | None) -> dict:
    """Read the final answer in ``text`` and compare it with ``reference``: what counts as an answer.

    Returns ``correct``, ``predicted`` (the answer text found, or None), ``verdict`` and
    ``strict_format`` (the answer sits in one ``<answer>`` tag, the only one). Verdicts:

    * ``"correct"``
    * ``"wrong_number"``: a number was found and it is not the reference
    * ``"wrong_answer"``: an answer was found that is not a plain number and math-verify
      did not find it equal to the reference (``"x+1"``, ``"forty"``)
    * ``"check_timeout"``: math-verify was still computing after ``MATH_VERIFY_SECONDS``
      (``9^{9^{9}}``) and was cut; counted as wrong
    * ``"no_answer"``: nothing that looks like an answer

    Never raises on ``text``, and returns within ``MATH_VERIFY_SECONDS`` of checking.
    """
    found = extract_answer(text, lenient=True)
    if found.how == "none" or not found.text:
        return {"correct": False, "predicted": None, "verdict": "no_answer", "strict_format": False}
    strict = found.strict and text.count(ANSWER_OPEN) == 1 and text.count(ANSWER_CLOSE) == 1
    judged = {"correct": False, "predicted": found.text, "verdict": "no_answer", "strict_format": strict}
    reference_value = to_number(reference) if reference is not None else None
    if found.value is not None and reference_value is not None:
        correct = answers_match(found.value, reference_value)
    elif reference is not None and len(found.text) <= MATH_VERIFY_MAX_CHARS:
        correct = _math_verify.equal(reference, found.text, MATH_VERIFY_SECONDS)  # "1/2" vs "0.5", "\\frac{3}{4}", non-numeric golds
    else:
        correct = False
    if found.value is not None:
        judged["predicted"] = format_number(found.value)  # canonical: "$1,000.00" -> "1000"
    judged["correct"] = bool(correct)
    if correct is None:
        judged["verdict"] = "check_timeout"
    else:
        judged["verdict"] = "correct" if correct else ("wrong_number" if found.value is not None else "wrong_answer")
    return judged


# --- text in a conversation stays text ---------------------------------------------------------------
# While the template renders, each special-token string in a message's text (and the escape character
# itself) is written as ESCAPE + one code character, so the only special-token strings in the rendered text
# are the template's own; the text between them is tokenised with every special token's string as ordinary
# characters. Code characters: ESCAPE for ESCAPE, chr(_CODE_BASE + k) for the k-th special string.
ESCAPE = "\U0010FFFD"  # a private-use character of plane 16: no template writes it
_CODE_BASE = 0xF0000  # plane 15 (private use): one code character per special-token string


def special_strings(tokenizer) -> list[str]:
    """The strings of the tokenizer's special tokens (``<|im_start|>``, ``<|im_end|>``...), longest first."""
    return sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special}, key=len, reverse=True)


def _texts(message: dict) -> list[str]:
    """The text a message carries: its content, a string or a list of ``{"type": "text", "text": ...}`` parts."""
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return []


def _map_texts(message: dict, fn) -> dict:
    """A copy of ``message`` with ``fn`` applied to each text it carries."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": fn(content)}
    if isinstance(content, list):
        parts = [{**part, "text": fn(part["text"])} if isinstance(part, dict) and isinstance(part.get("text"), str) else part
                 for part in content]
        return {**message, "content": parts}
    return message


def encode_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, the messages' text as ordinary characters.

    ``apply_chat_template(tokenize=True)`` renders the conversation to text and tokenises it whole, so
    a special token's string inside a message (a user's ``<|im_start|>assistant``, a tool's output, a
    dataset row) becomes the control token itself: a forged turn. Here it is tokenised as characters
    (the tokenizer's ``split_special_tokens``), and only the template's own special tokens are control
    tokens. A conversation without such a string (nearly all) takes the plain path: the same ids as
    ``apply_chat_template``. So does the text between control tokens on the other path: a tokenizer
    encodes the text between two special tokens on its own, which is what is done here.
    """
    specials = special_strings(tokenizer)
    if not specials or not any(s in text for m in messages for text in _texts(m) for s in specials + [ESCAPE]):
        return list(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                                  add_generation_prompt=add_generation_prompt, return_dict=False))
    codes = {ESCAPE: ESCAPE, **{s: chr(_CODE_BASE + k) for k, s in enumerate(specials)}}
    decodes = {code: s for s, code in codes.items()}
    escape = re.compile("|".join(re.escape(s) for s in [ESCAPE, *specials]))
    escaped = [_map_texts(m, lambda text: escape.sub(lambda hit: ESCAPE + codes[hit.group()], text)) for m in messages]
    rendered = tokenizer.apply_chat_template(escaped, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    unescape = re.compile(re.escape(ESCAPE) + "(.)", re.DOTALL)
    ids: list[int] = []
    for piece in re.split("(" + "|".join(re.escape(s) for s in specials) + ")", rendered):  # the template's control tokens
        if piece in specials:
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        elif piece:
            text = unescape.sub(lambda hit: decodes.get(hit.group(1), hit.group()), piece)
            ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids
