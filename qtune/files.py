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

- a target that is one of the command's inputs (the same file, also through
  a hard or symbolic link) is refused: ``emit p.yaml -o p.yaml`` would
  replace the profile by its unit.  Every input read through this module (or
  named with ``note_input``) is remembered for the process;
- the write itself never follows a link: the parent folder is opened with
  ``O_DIRECTORY|O_NOFOLLOW``, the temp file created ``O_EXCL|O_NOFOLLOW``
  relative to that descriptor and renamed within it, so a link swapped in
  between the check and the write is replaced, never written through;
- names are bounded (255 bytes a component) and missing parent folders are
  an error, never created (a typo in ``-o`` must not make a tree).

``Folder`` is the same for a folder of outputs (``probe --capture DIR``):
every file is written relative to the folder's descriptor.

Text inputs (space, workload, profile, dataset files) must be regular UTF-8
files: a FIFO would block the read forever, a binary file is no input.
"""

from __future__ import annotations

import codecs
import io
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qtune.errors import InputError, QtuneError, printable

_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket"}
# How much of a text input is checked for binary content up front: enough
# for any real header; a binary file shows NULs or bad UTF-8 long before.
_SNIFF_BYTES = 1 << 20


# Linux limits: NAME_MAX per component, PATH_MAX for the whole path.
NAME_MAX = 255
PATH_MAX = 4096
# (device, inode) of every input file this process has read: a write target
# that is one of them is refused.
_INPUTS: set[tuple[int, int]] = set()
# Folders qtune makes itself when missing (its defaults: profiles/,
# studies/<name>/): any other missing parent is an error.
_OWN_FOLDERS: set[Path] = set()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _show(path: Path | str) -> str:
    return printable(str(path))


def note_input(path: Path | str) -> None:
    """Remember ``path`` (followed through links) as an input of this
    command, so that no output replaces it."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    _INPUTS.add((st.st_dev, st.st_ino))


def reset() -> None:
    """Forget the inputs and own folders noted so far (a new command)."""
    _INPUTS.clear()
    _OWN_FOLDERS.clear()


def own_folder(path: Path) -> None:
    """Let outputs under ``path`` (one of qtune's default folders) create it."""
    _OWN_FOLDERS.add(path.absolute())


def _may_create(parent: Path) -> bool:
    return any(parent == f or f in parent.parents for f in _OWN_FOLDERS)


def _check_name(path: Path, what: str) -> None:
    shown = _show(path)
    raw = os.fsencode(str(path))
    if b"\0" in raw:
        raise InputError(f"{what} {shown}: a NUL byte in the name", hint="give a plain path")
    if len(raw) > PATH_MAX:
        raise InputError(f"{what}: a path of {len(raw)} bytes, over {PATH_MAX}",
                         hint="give a shorter path")
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            raise InputError(f"{what} {shown[:80]}...: a name of {len(part)} bytes, "
                             f"over the {NAME_MAX} a file system allows",
                             hint="give a shorter file name")


def _check_not_input(st: os.stat_result, path: Path, what: str,
                     inputs: Iterable[Path | str]) -> None:
    for p in inputs:
        note_input(p)
    if (st.st_dev, st.st_ino) in _INPUTS:
        raise InputError(f"{what} {_show(path)} is an input of this command",
                         hint="write the output to another file: replacing the input "
                         "would lose it")


def check_target(path: Path, what: str, *, force: bool = False,
                 inputs: Iterable[Path | str] = ()) -> Path:
    """Refuse a write target that is not a regular file or nothing, a
    symbolic link, a read-only file (unless ``force``), one of the command's
    ``inputs`` (or any input read so far), a name too long, or a path under a
    missing folder.  ``what`` names the flag in messages (``--out``)."""
    shown = _show(path)
    if str(path) == "" or str(path).endswith(os.sep) or path.name in ("", ".", ".."):
        raise InputError(f"{what} {shown}: a folder, not a file",
                         hint="give a file name, e.g. out.yaml")
    _check_name(path, what)
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
        _check_not_input(st, path, what, inputs)
        if not st.st_mode & 0o222 and not force:
            raise InputError(f"{what} {shown} is read-only",
                             hint="pass --force to replace it (it stays read-only), "
                             "or write elsewhere")
    parent = path.absolute().parent
    if not parent.is_dir() and not (_may_create(parent) and not parent.exists()):
        missing = not parent.exists() and not parent.is_symlink()
        raise InputError(f"{what} {shown}: {_show(parent)} "
                         + ("does not exist" if missing else "is not a folder"),
                         hint="create the folder first (qtune makes no folders it "
                         "was not asked to)" if missing else "give a path under a folder")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
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
    parent = path.absolute().parent
    if not parent.is_dir():
        raise InputError(f"{what} {shown}: {_show(parent)} is not an existing folder",
                         hint="create the folder above it first (qtune makes only the "
                         "folder it is given)")
    return path


def write_atomic(path: Path, data: str | bytes, *, force: bool = False,
                 what: str = "output", inputs: Iterable[Path | str] = ()) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: a
    reader sees the old file or the new one, never half of one.  The target
    is checked again here (it may have changed since the command started),
    and the write goes through the parent's descriptor (no link followed)."""
    check_target(path, what, force=force, inputs=inputs)
    parent = path.absolute().parent
    if _may_create(parent):
        parent.mkdir(parents=True, exist_ok=True)
    try:
        # Links above the target are the host's layout (/tmp -> /private/tmp):
        # resolved once; the resolved folder is then opened without following
        # a link swapped in since, and everything at or below the target is
        # reached through that descriptor.
        dfd = os.open(os.path.realpath(parent), _DIR_FLAGS)
    except OSError as exc:
        raise InputError(f"{what} {_show(path)}: cannot open {_show(parent)}: "
                         f"{exc.strerror}", hint="give a path in a real folder "
                         "(not through a symbolic link) you can write") from None
    try:
        _write_in(dfd, path.name, data, what=what, shown=path, force=force)
    finally:
        os.close(dfd)


def _write_in(dfd: int, name: str, data: str | bytes, *, what: str, shown: Path | str,
              force: bool = True) -> None:
    """Write ``name`` in the folder ``dfd``: checked with lstat there, a new
    temp file created exclusively (never through a link), renamed over it."""
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise InputError(f"{what} {_show(shown)} is a symbolic link",
                             hint="name the file itself")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} {_show(shown)} is not a regular file",
                             hint="give a file path")
        _check_not_input(st, Path(str(shown)), what, ())
        if not st.st_mode & 0o222 and not force:
            raise InputError(f"{what} {_show(shown)} is read-only",
                             hint="pass --force to replace it, or write elsewhere")
        mode = st.st_mode & 0o777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    # A short temp name: the target's own name may already be 255 bytes.
    tmp = f".qtune-{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, _NEW_FLAGS, 0o600, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            # Give the file the mode a plain open() would (or the replaced
            # file's), so a team can read profiles and units.
            os.fchmod(f.fileno(), mode)
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    os.fsync(dfd)


class Folder:
    """A folder of outputs (``probe --capture DIR``), opened once without
    following links; every file and sub-folder is made relative to its
    descriptor, so a link placed inside (``cap/nvml.json -> ../victim``) is
    replaced, never written through.  Only the folder itself is created
    (when missing), never its parents."""

    def __init__(self, path: Path, what: str) -> None:
        check_dir_target(path, what)
        _check_name(path, what)
        self.path, self.what = path, what
        try:
            os.mkdir(path, 0o777)
        except FileExistsError:
            pass
        except OSError as exc:
            raise InputError(f"{what} {_show(path)}: cannot create it: {exc.strerror}",
                             hint="give a folder under an existing one you can write") \
                from None
        try:
            self.fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            raise InputError(f"{what} {_show(path)}: cannot open it: {exc.strerror}",
                             hint="name a real folder, not a link") from None

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def write(self, rel: str | Path, data: str | bytes) -> None:
        """Write ``rel`` (a relative path, sub-folders made as needed)."""
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise InputError(f"{self.what}: {_show(rel)} is outside the folder",
                             hint="a relative path")
        for p in parts:
            if len(os.fsencode(p)) > NAME_MAX:
                raise InputError(f"{self.what}: a name over {NAME_MAX} bytes",
                                 hint="a shorter name")
        fd = self.fd
        opened: list[int] = []
        try:
            for d in parts[:-1]:
                try:
                    os.mkdir(d, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    fd = os.open(d, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise InputError(f"{self.what}: {_show(self.path / rel)}: "
                                     f"{exc.strerror} (a link or a file in the way?)",
                                     hint="use an empty folder") from None
                opened.append(fd)
            _write_in(fd, parts[-1], data, what=self.what, shown=self.path / rel)
        finally:
            for f in opened:
                os.close(f)


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string starting with a
    formula character (= + - @, tab, CR) gets a leading apostrophe (OWASP's
    advice); numbers stay numbers, and the cell is secret-masked."""
    if not isinstance(value, str):
        return value
    from qtune.errors import redact

    value = redact(value)
    if value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(value)  # "-1.5" is a number, not a formula
            return value
        except ValueError:
            return "'" + value
    return value


def csv_text(frame: Any) -> str:
    """A pandas DataFrame as CSV text, every cell through ``csv_cell`` (and
    the column names): the one way qtune writes CSV."""
    import pandas as pd

    safe = pd.DataFrame({csv_cell(str(c)): [csv_cell(v) for v in frame[c]]
                         for c in frame.columns}, index=frame.index)
    buf = io.StringIO()
    safe.to_csv(buf, index=False)
    return buf.getvalue()


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
    note_input(path)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise error(f"{what}: cannot read {_show(path)}: {why}", hint=hint) from None
