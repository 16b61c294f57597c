"""The service's durable store: every served episode, every acknowledged piece of feedback, every adapter version.

    store = SQLiteStore("runs/serve/store.db")               # one file; WAL mode; synchronous=FULL
    store.add_episode(record)                                 # what training needs: token ids, log-probs, adapter version
    store.add_feedback(episode_id, user, rating=-1, correct_answer="141")   # fsynced before it returns
    store.deploy(version, reason="passed the canary gate")   # the deployed pointer: the server follows it
    store.deployed()                                          # -> (version, adapter folder)
    key = store.create_key("ann")                             # a new key for ann (only its hash is stored)
    store.key_user(key)                                       # -> "ann" (None: no such key, or revoked)

Durability. SQLite in WAL mode with ``synchronous=FULL`` fsyncs the write-ahead log at every commit,
so a method that returned has its row on disk: the server answers 2xx only after the commit, and
``kill -9`` of the server at any moment loses no acknowledged feedback (``tests/test_serve_kill.py``
kills it mid-stream and counts). A WAL reader never blocks the writer, so the trainer process reads
episodes while the server writes them.

``Store`` is the interface (a Protocol): every method the server, the trainer and the simulation call, and
the ``path`` they keep adapters beside. A server database (Postgres, say) that offers all of these can replace
SQLite when one machine is outgrown.

Keys. A user is whoever holds one of their keys (``python -m helpers.serve key --user ann`` prints a new one):
the server takes the user of a request from its key, never from its body. A key is 32 random bytes
(``secrets.token_urlsafe``), and the store keeps only its SHA-256: a copy of the database gives no one a key. A
plain hash, not a slow password hash: a random 256-bit key cannot be guessed from its hash, so there is nothing
to slow down, and a lookup costs one indexed read per request.

Simplifications, named: per-token lists are stored as JSON text (a few hundred numbers per episode on
the tiny world; a GPU deployment would use a binary column); one connection per process, behind a lock.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class DuplicateFeedback(Exception):
    """This episode already has feedback (one piece per episode)."""


class UnknownEpisode(KeyError):
    """No episode with that id."""


USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")  # what a key's user may be called: printable, one word, <= 64


def in_sqlite_range(version: int) -> bool:
    """Whether ``version`` can be a stored version: SQLite's integers are 64-bit, and a larger Python int passed to it
    raises OverflowError (a version number from a request is any int until checked here)."""
    return 0 <= version < 2**63


def key_hash(key: str) -> str:
    """What the store keeps of a key (module docstring). Any text hashes, so a key of odd characters is simply unknown."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class EpisodeRecord:
    """One served request: the episode as the trainer needs it, and what the caller saw.

    world:  the hidden row the env was reset with (item, prices, quantity), so the trainer
            can replay the same request; truth: the world's own answer to it, read only by audits and plots
    """

    id: str
    user: str
    model: str  # what the caller asked for ("tiny-agent" or a pinned "tiny-agent@v0")
    adapter_version: int
    question: str
    answer: str | None  # the number in the final <answer>, None when the agent gave none
    stop_reason: str
    world: dict
    truth: str | None
    messages: list[dict]
    token_ids: list[int]  # (T,)
    mask: list[int]  # (T,) 1 = the policy sampled it
    logprobs: list[float]  # (T,) sampling log-probs where mask == 1
    prompt_len: int
    temperature: float
    latency_s: float
    created: float = field(default_factory=time.time)


class Store(Protocol):
    """What the server, the trainer and the simulation ask of a store."""

    path: Path  # the database; the adapters' folders are written beside it

    def add_episode(self, record: EpisodeRecord) -> None: ...
    def episode(self, episode_id: str) -> EpisodeRecord: ...
    def add_feedback(self, episode_id: str, user: str, rating: int | None, correct_answer: str | None) -> int: ...
    def feedback_since(self, after_id: int, limit: int) -> list[dict]: ...
    def feedback_count(self) -> int: ...
    def add_adapter(self, path: str, parent: int | None, canary: float | None, parent_canary: float | None, status: str, note: str) -> int: ...
    def adapters(self) -> list[dict]: ...
    def adapter_path(self, version: int) -> str: ...
    def set_canary(self, version: int, canary: float) -> None: ...
    def deploy(self, version: int, reason: str) -> None: ...
    def deployed(self) -> tuple[int, str]: ...
    def deployments(self) -> list[dict]: ...
    def get_setting(self, key: str, default=None): ...
    def set_setting(self, key: str, value) -> None: ...
    def create_key(self, user: str) -> str: ...
    def revoke_keys(self, user: str) -> int: ...
    def key_user(self, key: str) -> str | None: ...
    def was_deployed(self, version: int) -> bool: ...
    def close(self) -> None: ...


SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY, created REAL NOT NULL, user TEXT NOT NULL, model TEXT NOT NULL,
    adapter_version INTEGER NOT NULL, question TEXT NOT NULL, answer TEXT, stop_reason TEXT NOT NULL,
    world TEXT NOT NULL, truth TEXT, messages TEXT NOT NULL, token_ids TEXT NOT NULL, mask TEXT NOT NULL,
    logprobs TEXT NOT NULL, prompt_len INTEGER NOT NULL, temperature REAL NOT NULL, latency_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT, episode_id TEXT NOT NULL UNIQUE REFERENCES episodes(id),
    user TEXT NOT NULL, created REAL NOT NULL, rating INTEGER, correct_answer TEXT);
CREATE TABLE IF NOT EXISTS adapters (
    version INTEGER PRIMARY KEY, created REAL NOT NULL, path TEXT NOT NULL, parent INTEGER,
    canary REAL, parent_canary REAL, status TEXT NOT NULL, note TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS deployments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, version INTEGER NOT NULL REFERENCES adapters(version),
    reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keys (hash TEXT PRIMARY KEY, user TEXT NOT NULL, created REAL NOT NULL, revoked REAL);
"""

EPISODE_FIELDS = ("id", "created", "user", "model", "adapter_version", "question", "answer", "stop_reason", "world",
                  "truth", "messages", "token_ids", "mask", "logprobs", "prompt_len", "temperature", "latency_s")
JSON_FIELDS = ("world", "messages", "token_ids", "mask", "logprobs")


class SQLiteStore:
    """``Store`` on one SQLite file (module docstring). Safe to share between threads; several
    processes may open the same file (SQLite's own locking; WAL lets readers run beside the writer)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # fsync the log at every commit: a returned write is on disk
        self.db.execute("PRAGMA foreign_keys=ON")
        with self.lock:
            self.db.executescript(SCHEMA)

    def _write(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        """One statement in its own transaction, committed (and so fsynced) before it returns."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                cursor = self.db.execute(sql, args)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
            return cursor

    def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    # --- episodes ----------------------------------------------------------------------------

    def add_episode(self, record: EpisodeRecord) -> None:
        values = [getattr(record, name) for name in EPISODE_FIELDS]
        values = [json.dumps(v) if name in JSON_FIELDS else v for name, v in zip(EPISODE_FIELDS, values)]
        self._write(f"INSERT INTO episodes ({', '.join(EPISODE_FIELDS)}) VALUES ({', '.join('?' * len(EPISODE_FIELDS))})",
                    tuple(values))

    def episode(self, episode_id: str) -> EpisodeRecord:
        rows = self._read("SELECT * FROM episodes WHERE id = ?", (episode_id,))
        if not rows:
            raise UnknownEpisode(episode_id)
        row = dict(rows[0])
        return EpisodeRecord(**{k: json.loads(v) if k in JSON_FIELDS else v for k, v in row.items()})

    def episodes(self, after: float = 0.0, fields: tuple[str, ...] = ("id", "created", "user", "model", "adapter_version",
                                                                        "answer", "truth", "latency_s")) -> list[dict]:
        """Episodes created after ``after`` (a time), oldest first, a few columns (the plots read these)."""
        return [dict(r) for r in self._read(f"SELECT {', '.join(fields)} FROM episodes WHERE created > ? ORDER BY created", (after,))]

    # --- feedback ------------------------------------------------------------------------------

    def add_feedback(self, episode_id: str, user: str, rating: int | None, correct_answer: str | None) -> int:
        """Record one piece of feedback; returns its id once it is on disk.

        Raises ``UnknownEpisode`` and ``DuplicateFeedback`` (one piece per episode) and changes nothing then."""
        try:
            cursor = self._write("INSERT INTO feedback (episode_id, user, created, rating, correct_answer) VALUES (?, ?, ?, ?, ?)",
                                 (episode_id, user, time.time(), rating, correct_answer))
        except sqlite3.IntegrityError as error:
            if "UNIQUE" in str(error):
                raise DuplicateFeedback(episode_id) from None
            raise UnknownEpisode(episode_id) from None  # the foreign key: no such episode
        return int(cursor.lastrowid)

    def feedback_since(self, after_id: int, limit: int = 1000) -> list[dict]:
        """Feedback with id > ``after_id``, oldest first, joined with its episode's world and answers."""
        rows = self._read("SELECT f.id, f.episode_id, f.user, f.created, f.rating, f.correct_answer, e.answer, e.truth, "
                          "e.world, e.question FROM feedback f JOIN episodes e ON e.id = f.episode_id "
                          "WHERE f.id > ? ORDER BY f.id LIMIT ?", (after_id, limit))
        return [{**dict(r), "world": json.loads(r["world"])} for r in rows]

    def feedback_count(self) -> int:
        return self._read("SELECT COUNT(*) FROM feedback")[0][0]

    # --- adapters and the deployed pointer -------------------------------------------------------

    def add_adapter(self, path: str, parent: int | None, canary: float | None, parent_canary: float | None,
                    status: str, note: str) -> int:
        """Register an adapter version (its folder is already on disk); returns the new version number."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            version = self.db.execute("SELECT COALESCE(MAX(version) + 1, 0) FROM adapters").fetchone()[0]
            self.db.execute("INSERT INTO adapters VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (version, time.time(), str(path), parent, canary, parent_canary, status, note))
            self.db.execute("COMMIT")
        return version

    def adapters(self) -> list[dict]:
        return [dict(r) for r in self._read("SELECT * FROM adapters ORDER BY version")]

    def set_canary(self, version: int, canary: float) -> None:
        """Record the canary success of a version registered without one (the server's starting version)."""
        if self._write("UPDATE adapters SET canary = ? WHERE version = ? AND canary IS NULL", (canary, version)).rowcount != 1:
            raise KeyError(f"no adapter version {version} without a canary score")

    def deploy(self, version: int, reason: str) -> None:
        """Point the service at ``version`` (a new deployment, or a rollback to an older one)."""
        if not in_sqlite_range(version) or not self._read("SELECT 1 FROM adapters WHERE version = ?", (version,)):
            raise KeyError(f"no adapter version {version}; known: {[a['version'] for a in self.adapters()]}")
        self._write("INSERT INTO deployments (created, version, reason) VALUES (?, ?, ?)", (time.time(), version, reason))

    def deployed(self) -> tuple[int, str]:
        """The deployed version and its folder (raises LookupError when nothing was ever deployed)."""
        rows = self._read("SELECT d.version, a.path FROM deployments d JOIN adapters a ON a.version = d.version "
                          "ORDER BY d.id DESC LIMIT 1")
        if not rows:
            raise LookupError(f"{self.path}: no adapter deployed yet")
        return int(rows[0][0]), rows[0][1]

    def adapter_path(self, version: int) -> str:
        rows = self._read("SELECT path FROM adapters WHERE version = ?", (version,)) if in_sqlite_range(version) else []
        if not rows:
            raise KeyError(f"no adapter version {version}")
        return rows[0][0]

    def deployments(self) -> list[dict]:
        return [dict(r) for r in self._read("SELECT * FROM deployments ORDER BY id")]

    def was_deployed(self, version: int) -> bool:
        """Whether ``version`` was ever deployed: only those may be pinned by name (a version the canary gate refused
        never was). ``version`` is any Python int: one beyond SQLite's 64 bits is simply not there."""
        return in_sqlite_range(version) and bool(self._read("SELECT 1 FROM deployments WHERE version = ? LIMIT 1", (version,)))

    # --- settings (the world's drift switch lives here, shared by the server and the trainer) ----

    def get_setting(self, key: str, default=None):
        rows = self._read("SELECT value FROM settings WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    def set_setting(self, key: str, value) -> None:
        self._write("INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(value)))

    # --- keys: who a request speaks for (module docstring) --------------------------------------------

    def create_key(self, user: str) -> str:
        """A new key for ``user`` (their other keys stay valid); returned once, stored only as its hash."""
        if not isinstance(user, str) or not USER_NAME.fullmatch(user):
            raise ValueError(f"user {user!r}: give 1 to 64 letters, digits or . _ @ -, starting with a letter or digit")
        key = f"wb-{secrets.token_urlsafe(32)}"  # "wb-": a workbook key is recognisable in a log or a leaked file
        self._write("INSERT INTO keys (hash, user, created) VALUES (?, ?, ?)", (key_hash(key), user, time.time()))
        return key

    def revoke_keys(self, user: str) -> int:
        """Withdraw every key of ``user``; returns how many were valid. Their episodes and feedback stay."""
        return self._write("UPDATE keys SET revoked = ? WHERE user = ? AND revoked IS NULL", (time.time(), user)).rowcount

    def key_user(self, key: str) -> str | None:
        """The user a valid key belongs to; None for an unknown or revoked key."""
        rows = self._read("SELECT user FROM keys WHERE hash = ? AND revoked IS NULL", (key_hash(key),))
        return rows[0][0] if rows else None

    def close(self) -> None:
        with self.lock:
            self.db.close()
