"""Reads of an SQLite database kept on disk per database state, so a planner command whose database
did not change since the previous command neither re-reads nor re-builds what that one did (the
compiled tables, the calibration rows in force, the table runs of the provenance), and does not
import SQLAlchemy for it (~0.2 s of CPU, a quarter of an 18B ``layouts``).

The state of an SQLite file (:func:`db_state`) changes with every commit. A server database has no such
cheap state and is never cached here. Each entry's key also hashes the source of the modules
that produce it, so a code change rebuilds it.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


# Descriptors of the database files this process has read, by (device, inode), kept open while that inode
# is the file at its path: closing any descriptor of a file drops every POSIX advisory lock the process holds
# on it, SQLite's included (https://www.sqlite.org/howtocorrupt.html, 2.2). A read-and-close here while an
# engine of this process held the database let another process take itself for the last connection,
# checkpoint and delete the -wal log that this process went on committing into: `validate --nproc 2 --bench`
# lost its stored run that way. A descriptor whose path now names another file (or none) is closed: no other
# process can reach that inode by name, so its locks guard nothing.
_KEPT_FDS: dict[tuple[int, int], tuple[Path, int]] = {}


def _pread(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of ``path`` through a descriptor kept open (see _KEPT_FDS).
    Raises OSError when the file cannot be opened."""
    st = os.stat(path)
    kept = _KEPT_FDS.get((st.st_dev, st.st_ino))
    if kept is None:
        _close_orphans()
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        fst = os.fstat(fd)
        # a second descriptor of a kept inode (the file changed between stat and open) is left open too
        kept = _KEPT_FDS.setdefault((fst.st_dev, fst.st_ino), (path, fd))
        return os.pread(fd, n, 0)
    return os.pread(kept[1], n, 0)


def _close_orphans() -> None:
    for key, (path, fd) in list(_KEPT_FDS.items()):
        try:
            st = os.stat(path)
            current = (st.st_dev, st.st_ino) == key
        except OSError:
            current = False
        if not current:
            del _KEPT_FDS[key]
            os.close(fd)


def db_state(url: str) -> tuple | None:
    """What identifies the committed content of an SQLite database file: None for a server or
    in-memory database, or a file that does not exist; else a tuple of

    - the main file's (inode, size, mtime in ns) and its header's file change counter (bytes 24-28,
      bumped by every commit that writes the file itself);
    - while its ``-wal`` log holds frames: the wal-index header's description of the committed log
      (last valid frame mxFrame, database size in pages, the running checksum of the frames and the
      log's salts), so two commits within one mtime tick of a log rewritten in place still differ;
      the log's (inode, size, mtime) instead where there is no readable wal-index.

    Not the log's file times or the rest of the wal-index header: connections create an empty log
    when they open the database and delete it when the last one closes, and the first connection
    after all others closed rebuilds the wal-index, resetting its change counter and checksum. None
    of these change a row; a command reading an unchanged database (and opening it itself midway)
    must keep seeing one state (file formats: https://www.sqlite.org/fileformat2.html and the
    WAL-index header in https://www.sqlite.org/walformat.html).
    """
    if not url.startswith("sqlite:///") or url in ("sqlite://", "sqlite:///:memory:"):
        return None
    db = Path(url[len("sqlite:///"):])
    try:
        st = db.stat()
        counter = _pread(db, 28)[24:28]
    except OSError:
        return None
    state: list = [(st.st_ino, st.st_size, st.st_mtime_ns, counter)]
    try:
        wal = db.with_name(db.name + "-wal").stat()
    except OSError:
        return tuple(state)
    if wal.st_size == 0:
        return tuple(state)
    try:
        index = _pread(db.with_name(db.name + "-shm"), 40)
    except OSError:
        index = b""
    if len(index) == 40 and index[12] == 1:  # isInit: the wal-index describes the log
        if index[16:20] != bytes(4):  # mxFrame > 0: committed frames not yet in the main file
            state.append(index[16:40])
    else:
        state.append((wal.st_ino, wal.st_size, wal.st_mtime_ns))
    return tuple(state)


def cache_root() -> Path:
    """The folder of every on-disk cache of scaleplan (compiled tables, rule hold-outs, ridge samples, database
    reads): ``$SCALEPLAN_CACHE`` if set, else ``~/.cache/scaleplan``. Everything in it is derived and safe to
    delete (it is rebuilt on the next command); ``scaleplan db status`` prints it."""
    return Path(os.environ.get("SCALEPLAN_CACHE") or Path.home() / ".cache" / "scaleplan")


def cache_file(kind: str, ext: str, key: bytes, modules: tuple[str, ...] = ()) -> Path | None:
    """``$SCALEPLAN_CACHE/<kind>-<digest>.<ext>`` (default ~/.cache/scaleplan), the digest over ``key``
    and the source of ``modules`` (a code change gives a new file); None when no cache folder can be
    made (the caller then computes again). Every on-disk cache of scaleplan lives here."""
    import importlib.util

    code = b""
    for mod in modules:
        origin = importlib.util.find_spec(mod).origin
        code += Path(origin).read_bytes() if origin else mod.encode()
    digest = hashlib.sha256(key + code).hexdigest()[:24]
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return root / f"{kind}-{digest}.{ext}"


def cache_path(kind: str, url: str, key: Any, modules: tuple[str, ...]) -> Path | None:
    """:func:`cache_file` for ``key`` read from ``url`` in its present state by the code of ``modules``;
    None when the database has no state (:func:`db_state`) or no cache folder can be made."""
    state = db_state(url)
    if state is None:
        return None
    return cache_file(kind, "pkl", repr((url, key, state)).encode(), modules)


def cached_read(kind: str, url: str, key: Any, modules: tuple[str, ...], read: Callable[[], T],
                valid: Callable[[Any], bool] = lambda v: True) -> T:
    """``read()``, or what it returned for the same (url, key, database state, code) before
    (:func:`stored` at :func:`cache_path`)."""
    return stored(cache_path(kind, url, key, modules), read, valid)


def stored(path: Path | None, compute: Callable[[], T], valid: Callable[[Any], bool] = lambda v: True) -> T:
    """What ``compute()`` returned when it was stored at ``path`` (a pickle), else ``compute()``, stored
    there. An unreadable entry, or one ``valid`` rejects, is computed again; exceptions of ``compute``
    propagate and nothing is stored for them. Entries are written atomically (several commands may race);
    ``path`` None (no cache folder, or a database with no state) computes without storing."""
    if path is not None:
        try:
            with open(path, "rb") as f:
                value = pickle.load(f)
            if valid(value):
                return value
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
            pass  # missing or unreadable: computed below
    value = compute()
    if path is not None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
    return value
