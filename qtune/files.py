"""Files qtune reads from and writes to a user's paths, checked first.

Writes are atomic (temp file in the same folder, fsync, rename), which
*replaces* whatever sits at the target.  So a target is checked before any
work starts and again just before the rename:

- only a regular file (or nothing) is replaced: ``/dev/null``, a FIFO, a
  socket or a folder is refused (as root, a rename over ``/dev/null`` would
  turn it into a plain file for every program on the host);
- a symbolic link is refused, naming where it points: the rename would
  replace the link, not write through it, and either one is a surprise;
- a read-only file stays read-only: refused unless ``--force``, and a forced
  write keeps the file's mode.

Text inputs (space, workload, profile, dataset files) must be regular UTF-8
files: a FIFO would block the read forever, a binary file is no input.
"""

from __future__ import annotations

import codecs
import os
import stat
import tempfile
from pathlib import Path

from qtune.errors import InputError, QtuneError, printable

_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket"}
# How much of a text input is checked for binary content up front: enough
# for any real header; a binary file shows NULs or bad UTF-8 long before.
_SNIFF_BYTES = 1 << 20


def _show(path: Path | str) -> str:
    return printable(str(path))


def check_target(path: Path, what: str, *, force: bool = False) -> Path:
    """Refuse a write target that is not a regular file or nothing, a
    symbolic link, or a read-only file (unless ``force``).  ``what`` names
    the flag in messages (``--out``)."""
    shown = _show(path)
    if str(path) == "" or str(path).endswith(os.sep):
        raise InputError(f"{what} {shown}: a folder, not a file",
                         hint="give a file name, e.g. out.yaml")
    if path.is_symlink():
        raise InputError(
            f"{what} {shown} is a symbolic link (to {_show(os.readlink(path))})",
            hint="name the file itself: qtune replaces a file by renaming a new one "
            "over it, which would replace the link")
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):  # (the parent check says which)
        st = None
    except OSError as exc:
        raise InputError(f"{what} {shown}: {exc.strerror}",
                         hint="give a path qtune can write") from None
    if st is not None:
        kind = _KINDS.get(stat.S_IFMT(st.st_mode))
        if kind is not None:
            raise InputError(f"{what} {shown} is {kind}, not a regular file",
                             hint="give a file path; qtune never replaces devices, "
                             "FIFOs, sockets or folders")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} {shown} is not a regular file",
                             hint="give a file path")
        # Mode bits, not os.access: root may write anything, but a 0444
        # file says someone meant it to stay as it is.
        if not st.st_mode & 0o222 and not force:
            raise InputError(f"{what} {shown} is read-only",
                             hint="pass --force to replace it (it stays read-only), "
                             "or write elsewhere")
    parent = _existing_parent(path)
    if not parent.is_dir():
        raise InputError(f"{what} {shown}: {_show(parent)} is not a folder",
                         hint="give a path under a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{what} {shown}: cannot write into {_show(parent)}",
                         hint="give a path in a folder you can write")
    return path


def check_dir_target(path: Path, what: str) -> Path:
    """A folder to write files into: a folder or nothing (then created),
    never a file, device or link."""
    shown = _show(path)
    if path.is_symlink():
        raise InputError(f"{what} {shown} is a symbolic link",
                         hint="name the folder itself")
    if path.exists() and not path.is_dir():
        try:
            kind = _KINDS.get(stat.S_IFMT(path.stat().st_mode), "a file")
        except OSError:
            kind = "not a folder"
        raise InputError(f"{what} {shown} is {kind}, not a folder",
                         hint="give a new or existing folder")
    parent = _existing_parent(path)
    if not parent.is_dir():
        raise InputError(f"{what} {shown}: {_show(parent)} is not a folder",
                         hint="give a path under a folder")
    return path


def _existing_parent(path: Path) -> Path:
    p = path.absolute().parent
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def write_atomic(path: Path, data: str | bytes, *, force: bool = False,
                 what: str = "output") -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: a
    reader sees the old file or the new one, never half of one.  The target
    is checked again here (it may have changed since the command started)."""
    check_target(path, what, force=force)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            # mkstemp makes the file 0600; give it the mode a plain open()
            # would (or the replaced file's), so a team can read profiles
            # and units.
            try:
                mode = path.stat().st_mode & 0o777
            except FileNotFoundError:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
            os.fchmod(f.fileno(), mode)
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def check_text_file(path: Path, what: str, hint: str,
                    error: type[QtuneError] = InputError) -> None:
    """Refuse an input that is not a regular, readable UTF-8 text file,
    reading at most its first MiB."""
    shown = _show(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise error(f"{what}: cannot read {shown}: {exc.strerror}", hint=hint) from None
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise error(f"{what}: {shown} is {kind}", hint=hint)
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as exc:
        raise error(f"{what}: cannot read {shown}: {exc.strerror}", hint=hint) from None
    try:
        # Incremental: a multi-byte character cut at the sniff's end is fine.
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < _SNIFF_BYTES)
    except UnicodeDecodeError as exc:
        raise error(f"{what}: {shown} is not UTF-8 text (byte {exc.start})",
                    hint=hint) from None
    if b"\0" in head:
        raise error(f"{what}: {shown} is binary (holds NUL bytes), not text", hint=hint)


def read_text(path: Path, what: str, hint: str,
              error: type[QtuneError] = InputError) -> str:
    """The whole text of a checked input file (``check_text_file``)."""
    check_text_file(path, what, hint, error)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise error(f"{what}: cannot read {_show(path)}: {why}", hint=hint) from None
