"""Stockfish's answers kept: in memory, and in a SQLite file that runs and processes share.

A search at a fixed depth gives the same answer every time, so it is made once per position and limits and
kept. The file is SQLite's: a crash leaves no
half row, and a file SQLite cannot use is an error naming it. A row that is not what a search gives (edited by
hand, or written by another version of the pool) is searched again, never used.

Owns the cache file and its rows; `engine` owns the keys and what a valid value is. Imports the standard
library only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from typing import Any, Callable, Iterator

LOG = logging.getLogger("rookworld_rlvr.engine")


class EngineCacheError(ValueError):
    """The analysis cache file cannot be used (not a SQLite database, damaged, not writable); names the file."""


class AnalysisCache:
    """In-memory dict in front of an optional SQLite file shared between processes.

    Every write is its own autocommitted INSERT OR REPLACE, so a crash never
    leaves half a row; WAL mode and a busy timeout let processes share the file.
    A file SQLite cannot use is an `EngineCacheError` naming it; it is never deleted or replaced here,
    since other processes may share it.
    """

    def __init__(self, path: str | None) -> None:
        self._mem: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._path = path
        self._warned = False  # a damaged entry said once, not per position
        if path is not None:
            with self._named():
                self._db = self._open(path)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """SQLite's errors (`file is not a database`, `database disk image is malformed`) with the file named."""
        try:
            yield
        except sqlite3.OperationalError as e:  # a path it cannot open or write (a folder, a read-only file system)
            raise EngineCacheError(f"engine cache {self._path}: {e} (give a file this process can write; `rookworld "
                                   "train` runs without one with --engine-cache null)") from None
        except sqlite3.Error as e:  # not a database, damaged pages
            raise EngineCacheError(f"engine cache {self._path}: {e} (it holds only Stockfish analyses, made again as "
                                   "needed: delete it or move it aside)") from None

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        db = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout=60000")
        for attempt in range(50):  # switching to WAL needs a moment of exclusive access
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                break
            except sqlite3.OperationalError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def get(self, key: str, valid: Callable[[Any], bool] = lambda value: True) -> Any | None:
        """The value kept under `key`; None where there is none, or where the file's is not JSON or not `valid`
        (a hand-edited row, or one another version wrote): then the caller makes it again and `put` replaces it."""
        with self._lock:
            if key in self._mem:
                return self._mem[key]
            if self._db is None:
                return None
            with self._named():
                row = self._db.execute("SELECT value FROM cache WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            try:
                value = json.loads(row[0])
            except json.JSONDecodeError:
                value = None
            if value is None or not valid(value):
                if not self._warned:
                    self._warned = True
                    LOG.warning("engine cache %s: an entry that is not what a search gives (%.60s) is searched again",
                                self._path, row[0])
                return None
            self._mem[key] = value
            return value

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._mem[key] = value
            if self._db is not None:
                with self._named():
                    self._db.execute("INSERT OR REPLACE INTO cache (key, value) VALUES (?, ?)",
                                     (key, json.dumps(value)))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
