"""Where a study is stored: the storage URL, its journal or database file,
and the files a study writes, checked before anything is created; opening
storage (read-only for ``qtune report`` and ``--pick``)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import optuna
from optuna.storages import BaseStorage
from sqlalchemy.exc import IntegrityError, ProgrammingError

from qtune.errors import InputError, StudyError, mask_url, printable
from qtune.files import check_target, note_input, own_folder
from qtune.host.installed import EngineInstall
from qtune.search import fleet
from qtune.search.config import TuneConfig, check_study_name
from qtune.search.records import StudyAttr, TrialRecord, TrialStatus

_STORAGE_HINT = ("e.g. sqlite:///studies/x.db, postgresql://user@host/db, "
                 "grpc://proxy:13000, or journal:///path/file.log")


def check_storage_url(url: str) -> None:
    """What can be known of a storage URL without connecting: a URL, and
    for the file-backed ones, a folder that exists (qtune creates none
    outside studies/) and a journal that ends in a whole record."""
    shown = printable(mask_url(url))
    if "://" not in url:
        # Not echoed: a mistyped URL may still hold a password.
        raise InputError("--storage: not a URL (no scheme://)", hint=_STORAGE_HINT)
    if url.startswith("grpc://"):
        fleet.parse_grpc_url(url)
    path = storage_path(url)
    if path is None:
        return
    if not path.name:
        raise StudyError(f"--storage {shown}: names no file", hint=_STORAGE_HINT)
    if not path.parent.is_dir():
        raise StudyError(
            f"--storage {shown}: folder {printable(str(path.parent))} does not exist",
            hint=f"create it first (mkdir -p {printable(str(path.parent))}); qtune "
            "does not create folders for a storage URL")
    if path.exists():
        check_journal(path) if url.startswith("journal://") else _regular(path)


def storage_path(url: str) -> Path | None:
    """The file of a journal or sqlite URL (None: not file-backed, or
    sqlite in memory)."""
    if url.startswith("journal://"):
        return Path(url[len("journal://"):])
    if url.startswith("sqlite:///"):
        # The file as SQLAlchemy reads the URL (percent-decoded, up to '?'),
        # so that the checks and the read-only open see the file a write would.
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            rest = make_url(url).database or ""
        except (ArgumentError, ValueError):
            rest = url[len("sqlite:///"):].partition("?")[0]
        return Path(rest) if rest and rest != ":memory:" else None
    return None


def _regular(path: Path) -> None:
    if path.is_symlink() or not path.is_file():
        raise StudyError(f"storage {printable(str(path))} is not a regular file",
                         hint="point the storage URL at the study's own file")


def check_journal(path: Path) -> None:
    """Refuse a journal whose last record is cut short (a qtune killed mid-
    write, a full disk): Optuna would append the next record onto the
    partial line, after which the whole study is unreadable."""
    _regular(path)
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb") as f:
        # The last line: read back from the end until a newline before it.
        chunk, pos, tail = 1 << 16, size, b""
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            if tail.rstrip(b"\n").rfind(b"\n") >= 0 or len(tail) > (64 << 20):
                break
    last = tail.rstrip(b"\n").rpartition(b"\n")[2]
    whole = tail.endswith(b"\n")
    if whole:
        try:
            import json

            json.loads(last)
        except ValueError:
            whole = False
    if not whole:
        keep = size - len(last) - (1 if tail.endswith(b"\n") else 0)
        shown = printable(str(path))
        raise StudyError(
            f"journal {shown} ends in a partial record ({size - keep} bytes after the "
            "last whole one): appending to it would make the study unreadable",
            hint=f"a qtune run was cut off mid-write; drop the partial record with "
            f"'truncate -s {keep} {shown}' (qtune report still reads the study)")


def _storage(cfg: TuneConfig, name: str) -> tuple[str, Path]:
    """The storage URL and the study's folder.  ``name`` is checked: every
    file a study writes stays under studies/ and profiles/."""
    check_study_name(name)
    study_dir = (cfg.studies_dir / name).absolute()
    if cfg.storage:
        check_storage_url(cfg.storage)
        if (path := storage_path(cfg.storage)) is not None:
            note_input(path)  # no output of this command may replace it
        return cfg.storage, study_dir
    journal = (cfg.studies_dir / (name + ".log")).absolute()
    if journal.exists() or journal.is_symlink():
        check_journal(journal)
        note_input(journal)
    return f"journal://{journal}", study_dir


def study_files(cfg: TuneConfig, name: str) -> tuple[str, Path]:
    """The storage URL and study folder, with every file the study will
    write checked: the journal, the profile, the trials table."""
    url, study_dir = _storage(cfg, name)
    own_folder(study_dir)  # qtune's own folders, made when missing
    if cfg.out is None:
        own_folder(cfg.profiles_dir)
        check_target(cfg.profiles_dir / f"{name}.yaml", "profile", force=cfg.force)
    check_target(study_dir / "trials.csv", "trials table", force=True)
    return url, study_dir


def recorded_install(url: str, name: str) -> EngineInstall | None:
    """The engine a study ran with, as it recorded it (None for a study
    from before qtune recorded it)."""
    study = optuna.load_study(study_name=name, storage=open_storage(url, read_only=True))
    rec = study.user_attrs.get(StudyAttr.ENGINE_INSTALL)
    return EngineInstall(**rec) if isinstance(rec, dict) else None


def check_pickable(pick: int, name: str, url: str) -> None:
    """``--pick`` re-picks from a study that exists: refuse a missing study
    or a trial that cannot be picked, reading the storage only."""
    try:
        study = optuna.load_study(study_name=name,
                                  storage=open_storage(url, read_only=True))
    except KeyError:
        raise StudyError(f"--pick {pick}: no study {name!r} in {mask_url(url)}",
                         hint="--pick writes the profile of a trial of a finished "
                         "study; run the search first (without --pick)") from None
    recs = [TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)]
    ok = [r.number for r in recs if r.feasible and r.value is not None
          and r.status == TrialStatus.OK]
    if pick not in ok:
        raise InputError(
            f"--pick {pick}: trial {pick} of study {name} is not a fully measured, "
            "feasible trial",
            hint=("pick one of trials " + ", ".join(map(str, ok))) if ok
            else "no trial can be picked yet: run more trials")


def open_storage(url: str, *, read_only: bool = False,
                 heartbeat_s: int | None = None) -> optuna.storages.BaseStorage:
    """Open a storage.  Folders are created only for a journal (the default
    one under studies/; a --storage journal's folder was checked to exist);
    ``read_only`` (report, --pick) creates nothing: the file must exist, and
    sqlite is opened read-only.  ``heartbeat_s``: a database server shared
    by workers (``qtune.search.fleet``) gets Optuna's heartbeat and retry of
    a dead worker's trial."""
    if read_only:
        return ReadOnlyStorage(_open(url, read_only=True))
    return _open(url, heartbeat_s=heartbeat_s)


def _open(url: str, *, read_only: bool = False,
          heartbeat_s: int | None = None) -> optuna.storages.BaseStorage:
    if url.startswith("grpc://"):
        return _open_proxy(url)
    path = storage_path(url)
    if path is not None:  # an output of this command must never replace it
        note_input(path)
    if read_only and path is not None and not path.is_file():
        raise StudyError(f"no storage file {printable(str(path))}",
                         hint="check --study / --storage; report and --pick read an "
                         "existing study and create nothing")
    try:
        if url.startswith("journal://"):
            from optuna.storages.journal import JournalFileBackend

            assert path is not None
            if not read_only:
                path.parent.mkdir(parents=True, exist_ok=True)
            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        if read_only and path is not None:
            # SQLite's own read-only mode: not even a table is created.  The
            # path is percent-encoded: a '#' or '?' in it would otherwise end
            # the file name and drop ?mode=ro (and create a database).
            url = sqlite_ro_url(path)
        return _open_rdb(url, read_only=read_only, heartbeat_s=heartbeat_s)
    except Exception as exc:  # sqlalchemy/driver errors vary widely
        raise StudyError(
            f"cannot open storage {mask_url(url)}: {type(exc).__name__}: "
            f"{exc}".splitlines()[0][:300],
            hint="check the URL; PostgreSQL needs its driver: pip install 'qtune[fleet]'",
        ) from None


def _open_rdb(url: str, *, read_only: bool,
              heartbeat_s: int | None) -> optuna.storages.RDBStorage:
    """An SQLAlchemy storage (SQLite, PostgreSQL), its creation retried when
    workers started together race to make Optuna's tables."""
    # No heartbeat on one host: trials a killed run left RUNNING are
    # failed on resume instead (run_study).  A fleet's workers beat
    # their trials themselves (fleet.Heartbeat).  SQLite gets a lock timeout.
    kwargs: dict[str, Any] = (
        {"connect_args": {"timeout": 20.0}} if url.startswith("sqlite") else {})
    beat: dict[str, Any] = {}
    if fleet.is_fleet(url):
        # A pooled connection is checked before use: a database restarted
        # between two calls costs a reconnect, not the worker (or proxy).
        kwargs["pool_pre_ping"] = True
        if heartbeat_s is not None:
            beat = fleet.storage_kwargs(heartbeat_s)
            fleet.quiet_heartbeat_warning()
    with warnings.catch_warnings():
        # The heartbeat arguments are "experimental" in Optuna's words:
        # a warning on every worker's start says nothing to its user.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for attempt in range(5):
            try:
                # Read-only: never create Optuna's tables in an empty
                # database (nor check/migrate its schema version).
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=kwargs, **beat, skip_table_creation=read_only)
            except (IntegrityError, ProgrammingError) as exc:
                # Workers started together on an empty database race to
                # create Optuna's tables (PostgreSQL's IF NOT EXISTS is
                # not atomic): the loser finds them made on a retry.  The
                # race shows as a unique violation or, for the enum types,
                # as 'type "studydirection" already exists' (seen in CI
                # with three workers).
                lost_race = isinstance(exc, IntegrityError) or \
                    "already exists" in str(exc)
                if attempt == 4 or not lost_race:
                    raise
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")


def sqlite_ro_url(path: Path) -> str:
    """An SQLAlchemy URL that opens ``path`` with SQLite's ``mode=ro``,
    whatever characters the path holds."""
    from urllib.parse import quote

    # Encoded twice: SQLAlchemy decodes the database part once before it
    # hands "file:...?mode=ro" to SQLite, which decodes it again.  Once
    # would give SQLite a raw '#' (the rest, ?mode=ro included, a fragment).
    enc = quote(str(path.absolute()), safe="/").replace("%", "%25")
    return f"sqlite:///file:{enc}?mode=ro&uri=true"


_WRITES = ("create_new_study", "delete_study", "set_study_user_attr",
           "set_study_system_attr", "create_new_trial", "set_trial_param",
           "set_trial_state_values", "set_trial_intermediate_value",
           "set_trial_user_attr", "set_trial_system_attr")


_Method = TypeVar("_Method", bound=Callable[..., object])


def _delegated(method: _Method) -> _Method:
    """A stand-in for an abstract method of ``BaseStorage``, typed as that
    method: ``ReadOnlyStorage.__getattribute__`` answers every call to it,
    so the stand-in never runs (and, unlike the abstract method itself,
    does not leave the class abstract)."""
    def unreachable(*_: object, **__: object) -> NoReturn:
        raise AssertionError("ReadOnlyStorage delegates through __getattribute__")

    return cast(_Method, unreachable)


class ReadOnlyStorage(BaseStorage):
    """A storage whose write methods raise: ``report``, ``check`` and
    ``--pick`` read a study and by construction cannot append a trial or
    rewrite an attribute, whatever code path runs."""

    def __init__(self, inner: BaseStorage) -> None:
        self._inner = inner

    def __getattribute__(self, name: str) -> Any:
        if name in _WRITES:
            def refuse(*_: object, **__: object) -> NoReturn:
                raise StudyError(f"the study is open read-only ({name})",
                                 hint="report, check and --pick never change a study")
            return refuse
        if name in ("_inner", "__class__", "__dict__"):
            return object.__getattribute__(self, name)
        inner = object.__getattribute__(self, "_inner")
        if hasattr(type(inner), name) or name in getattr(inner, "__dict__", {}):
            return getattr(inner, name)
        return object.__getattribute__(self, name)

    # Abstract in BaseStorage, so named here for the class to be concrete,
    # with Optuna's own signatures; every call is answered by
    # __getattribute__ above (refused, or the inner storage's method).
    create_new_study = _delegated(BaseStorage.create_new_study)
    delete_study = _delegated(BaseStorage.delete_study)
    set_study_user_attr = _delegated(BaseStorage.set_study_user_attr)
    set_study_system_attr = _delegated(BaseStorage.set_study_system_attr)
    get_study_id_from_name = _delegated(BaseStorage.get_study_id_from_name)
    get_study_name_from_id = _delegated(BaseStorage.get_study_name_from_id)
    get_study_directions = _delegated(BaseStorage.get_study_directions)
    get_study_user_attrs = _delegated(BaseStorage.get_study_user_attrs)
    get_study_system_attrs = _delegated(BaseStorage.get_study_system_attrs)
    get_all_studies = _delegated(BaseStorage.get_all_studies)
    create_new_trial = _delegated(BaseStorage.create_new_trial)
    set_trial_param = _delegated(BaseStorage.set_trial_param)
    get_trial_id_from_study_id_trial_number = _delegated(
        BaseStorage.get_trial_id_from_study_id_trial_number)
    set_trial_state_values = _delegated(BaseStorage.set_trial_state_values)
    set_trial_intermediate_value = _delegated(
        BaseStorage.set_trial_intermediate_value)
    set_trial_user_attr = _delegated(BaseStorage.set_trial_user_attr)
    set_trial_system_attr = _delegated(BaseStorage.set_trial_system_attr)
    get_trial = _delegated(BaseStorage.get_trial)
    get_all_trials = _delegated(BaseStorage.get_all_trials)


# How long a worker waits for the storage proxy to answer when it starts.
PROXY_WAIT_S = 20.0


def _open_proxy(url: str) -> optuna.storages.BaseStorage:
    """A client of Optuna's gRPC storage proxy (``qtune storage-proxy``),
    once the proxy answers."""
    host, port = fleet.parse_grpc_url(url)
    shown = f"grpc://{printable(host)}:{port}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            proxy = optuna.storages.GrpcStorageProxy(host=host, port=port)
    except ImportError:
        raise StudyError(f"cannot open storage {shown}: grpcio is not installed",
                         hint="pip install 'qtune[fleet]'") from None
    try:
        proxy.wait_server_ready(timeout=PROXY_WAIT_S)
    except ConnectionError:
        proxy.close()
        raise StudyError(f"no storage proxy answers at {shown} (waited "
                         f"{PROXY_WAIT_S:.0f} s)",
                         hint="start it first, on a host that reaches the database: "
                         f"qtune storage-proxy --storage postgresql://... --port {port}"
                         ) from None
    return proxy
