"""The search: the only module that brings host, engine, server, load,
metrics, Optuna and the profile together.

One trial = free port → launch (own process group, log under the study
folder) → ready → warm-up + measured load → stop → record.  What a trial
can teach is always recorded:

- a combination the engine would refuse (``check``) is told as PRUNED
  without a launch (cheap, and TPE learns from pruned trials, not failed);
- a startup failure is PRUNED with its classified reason from the log;
- a measured trial is COMPLETE, with constraints for failed requests and
  each SLO (``trial.set_constraint``: feasible when all ≤ 0), so a trial with
  errors or a missed SLO cannot win;
- only a broken setup (no engine, bad model) stops the study, before any
  trial.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from qtune import __version__
from qtune.engines import get_engine, gpus_used
from qtune.engines.base import Engine, LoadView, Param, SpaceContext
from qtune.errors import (
    EngineError,
    InputError,
    ServerError,
    StudyError,
    mask_url,
    printable,
    redact,
)
from qtune.files import check_target, write_atomic
from qtune.host import HostFacts, placement, probe
from qtune.host.installed import EngineInstall
from qtune.measure import Measurement, ServerDied, interleaved, measure_load, measure_server
from qtune.metrics import metric_value
from qtune.model import ModelInfo, resolve_model
from qtune.objectives import get_objective, pareto_latency
from qtune.profile import EngineInfo, Profile, StudyRef
from qtune.search.config import (
    STUDY_NAME_MAX,
    TuneConfig,
    apply_overrides,
    check_config,
    check_levels,
    check_study_name,
    load_space_file,
)
from qtune.search.pruning import make_pruner
from qtune.search.records import (
    LAUNCHED,
    Attr,
    StudyAttr,
    TrialRecord,
    TrialStatus,
    feasible,
    ran_trials,
    write_record,
)
from qtune.search.space import (
    SAMPLERS,
    describe,
    distributions,
    grid_values,
    initial_design,
    make_sampler,
    startup_trials,
    tidy,
)
from qtune.server import free_port
from qtune.stats import bootstrap_median

__all__ = ["Reporter", "TrialRecord", "TuneResult", "distributions", "grid_values",
           "make_sampler", "prepare", "trials_frame", "tune", "winner"]

# Infrastructure faults say nothing about the configuration: retry them.
_RETRYABLE = {"port_in_use"}


class Reporter(Protocol):
    def note(self, text: str) -> None: ...
    def study_started(self, info: dict[str, Any]) -> None: ...
    def trial_phase(self, number: int, phase: str, detail: str) -> None: ...
    def trial_done(self, rec: TrialRecord, best: TrialRecord | None) -> None: ...


class NullReporter:
    def note(self, text: str) -> None:
        pass

    def study_started(self, info: dict[str, Any]) -> None:
        pass

    def trial_phase(self, number: int, phase: str, detail: str) -> None:
        pass

    def trial_done(self, rec: TrialRecord, best: TrialRecord | None) -> None:
        pass


@dataclass
class TuneResult:
    study_name: str
    storage: str
    best: TrialRecord | None
    baseline: TrialRecord | None
    trials: list[TrialRecord]
    profile_path: Path | None
    profile: Profile | None
    improvement: float | None  # best vs baseline, in the objective's sense
    memory_estimate: dict[str, Any] | None = None  # prediction vs launches
    pruning: dict[str, Any] | None = None  # trials stopped early, time saved
    stop_reason: str | None = None  # why fewer than --trials were launched
    pareto_front: list[dict[str, Any]] | None = None  # --objective pareto


@dataclass
class Prepared:
    cfg: TuneConfig
    host: HostFacts
    engine: Engine
    ctx: SpaceContext
    params: list[Param]
    fixed: dict[str, Any]
    direction: str
    study_name: str
    storage_url: str
    study_dir: Path
    user_set: frozenset[str] = frozenset()  # named in --space: never reshaped


def prepare(cfg: TuneConfig) -> Prepared:
    """Everything that can fail because of the input, checked before any
    trial or file is created."""
    # Order: the flags, then the files they name, then the model, then the
    # host (the probe runs --engine-python), then storage and the study,
    # and only then the engine: nothing is created or started for an input
    # that is refused.
    check_config(cfg)
    objective = get_objective(cfg.objective)
    direction = objective.direction
    engine = get_engine(cfg.engine)
    if cfg.sampler not in SAMPLERS:
        raise InputError(f"--sampler: unknown sampler {cfg.sampler!r}",
                         hint="choose one of " + ", ".join(SAMPLERS))
    if cfg.out is not None:
        check_target(cfg.out, "--out", force=cfg.force)
    if cfg.storage:
        check_storage_url(cfg.storage)
        if _storage_path(cfg.storage) is None and not cfg.storage.startswith("sqlite"):
            # A database server: connect now (driver missing, wrong password)
            # rather than after the probe and the engine check.
            open_storage(cfg.storage)
    if cfg.study is not None:
        # A named study's files are known now: check them before the probe.
        url, _ = _study_files(cfg, cfg.study)
        if cfg.pick is not None:
            # A re-pick reads a finished study: refuse a missing one before
            # anything else (no probe, no engine needed to say so).
            _pickable(cfg.pick, cfg.study, url)
    override = load_space_file(cfg.space_file) if cfg.space_file else None
    model = resolve_model(cfg.model)
    need = cfg.workload.max_total_len
    mml = cfg.max_model_len or model.max_context
    if cfg.workload.dataset is None and need > mml:
        raise InputError(
            f"the longest request (prefix + --input-len + --output-len = {need} "
            f"tokens) exceeds the model's context length {mml}",
            hint="shorten the workload or raise --max-model-len",
        )
    if objective.needs_slo and not [
        s for s in cfg.slo if s.metric != "throughput"
    ]:
        raise InputError(f"--objective {cfg.objective} needs a latency --slo",
                         hint="e.g. --slo 'ttft_p99<=500ms,tpot_p99<=50ms'")
    if cfg.levels:
        cfg = _with_levels(cfg, direction)
    host = probe(engine_python=cfg.engine_python)
    study_name = cfg.study or _default_study_name(model, cfg, host)
    storage_url, study_dir = _study_files(cfg, study_name)
    if cfg.pick is not None:
        if cfg.study is None:  # (a named study was checked above)
            _pickable(cfg.pick, study_name, storage_url)
        # A re-pick launches nothing: the study's trials are all there is.
        cfg = dataclasses.replace(cfg, trials=0, confirm_top=0)
    install = host.engines.get(cfg.engine)
    if install is None and cfg.pick is not None:
        # A re-pick writes the profile of a trial that ran: the engine that
        # ran it, as the study recorded it, and the trial's own command.
        install = _recorded_install(storage_url, study_name)
    if install is None:
        raise EngineError(
            f"{cfg.engine} is not installed for {host.engines.python}"
            + (f" ({host.engines.error})" if host.engines.error else ""),
            hint="pip install 'qtune[cpu]' on a CPU host or 'qtune[vllm]' on a GPU "
            "host, or pass --engine-python PATH of the engine's environment",
        )
    if install.build == "cuda" and not host.gpus and cfg.pick is None:
        raise EngineError(
            f"vLLM {install.version} is a CUDA build but no NVIDIA GPU is visible",
            hint=host.gpu.note or "install the CPU build: pip install 'qtune[cpu]'",
        )
    engine_args = None
    if cfg.engine == "vllm" and cfg.pick is None:
        from qtune.engines.vllm_args import engine_args as read_args

        engine_args = read_args(install)
    ctx = SpaceContext(host, model, install, cfg.max_model_len, engine_args,
                       exact=cfg.exact)
    params = engine.space(ctx)
    fixed: dict[str, Any] = {}
    if override is not None:
        params, fixed = apply_overrides(params, override, engine_args)
    make_sampler(cfg.sampler, params, cfg.seed, cfg.trials)  # fail before any file
    user_set = frozenset(override.entries) if override is not None else frozenset()
    return Prepared(cfg, host, engine, ctx, params, fixed, direction, study_name,
                    storage_url, study_dir, user_set)


def _with_levels(cfg: TuneConfig, direction: str) -> TuneConfig:
    """Check ``--levels`` and make the highest level the study's load (the
    one the sampler's own trials record, shaping and pruning use)."""
    wl = cfg.workload
    if direction != "pareto":
        raise InputError("--levels needs --objective pareto",
                         hint="each level is a point of the throughput/latency front; "
                         "for one load, use --rate or --concurrency")
    if wl.dataset:
        raise InputError("--levels cannot be combined with --dataset",
                         hint="later levels would re-send the file's prompts and prefix "
                         "caching would flatter them; use synthetic prompts")
    if wl.concurrency is not None and any(v != int(v) for v in cfg.levels):
        raise InputError(f"--levels {','.join(f'{v:g}' for v in cfg.levels)}: with "
                         "--concurrency the levels are stream counts",
                         hint="use whole numbers, e.g. --levels 2,4,8")
    levels = check_levels(cfg.levels)
    top = levels[-1]
    return dataclasses.replace(cfg, levels=levels, workload=_at_load(
        wl, int(top) if wl.concurrency is not None else top))


def _default_study_name(model: ModelInfo, cfg: TuneConfig, host: HostFacts) -> str:
    wl = cfg.workload
    load = f"r{wl.rate:g}" if wl.rate is not None else f"c{wl.concurrency or 1}"
    raw = (f"{model.served_name}-{cfg.engine}-{host.fingerprint()['id'][:6]}"
           f"-i{wl.input_len}-o{wl.output_len}-{load}-{cfg.objective}")
    # The model's folder name is anyone's: keep the safe alphabet, no
    # leading dot, no "..", and a length check_study_name accepts.
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", raw)
    name = re.sub(r"\.{2,}", ".", name).strip("-.")[:STUDY_NAME_MAX].rstrip("-.")
    return check_study_name(name or "study", "study name")


_STORAGE_HINT = ("e.g. sqlite:///studies/x.db, postgresql://user@host/db, or "
                 "journal:///path/file.log")


def check_storage_url(url: str) -> None:
    """What can be known of a storage URL without connecting: a URL, and
    for the file-backed ones, a folder that exists (qtune creates none
    outside studies/) and a journal that ends in a whole record."""
    shown = printable(mask_url(url))
    if "://" not in url:
        # Not echoed: a mistyped URL may still hold a password.
        raise InputError("--storage: not a URL (no scheme://)", hint=_STORAGE_HINT)
    path = _storage_path(url)
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


def _storage_path(url: str) -> Path | None:
    """The file of a journal or sqlite URL (None: not file-backed, or
    sqlite in memory)."""
    if url.startswith("journal://"):
        return Path(url[len("journal://"):])
    if url.startswith("sqlite:///"):
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
        return cfg.storage, study_dir
    journal = (cfg.studies_dir / (name + ".log")).absolute()
    if journal.exists() or journal.is_symlink():
        check_journal(journal)
    return f"journal://{journal}", study_dir


def _study_files(cfg: TuneConfig, name: str) -> tuple[str, Path]:
    """The storage URL and study folder, with every file the study will
    write checked: the journal, the profile, the trials table."""
    url, study_dir = _storage(cfg, name)
    if cfg.out is None:
        check_target(cfg.profiles_dir / f"{name}.yaml", "profile", force=cfg.force)
    check_target(study_dir / "trials.csv", "trials table", force=True)
    return url, study_dir


def _recorded_install(url: str, name: str) -> EngineInstall | None:
    """The engine a study ran with, as it recorded it (None for a study
    from before qtune recorded it)."""
    study = optuna.load_study(study_name=name, storage=open_storage(url, read_only=True))
    rec = study.user_attrs.get(StudyAttr.ENGINE_INSTALL)
    return EngineInstall(**rec) if isinstance(rec, dict) else None


def _pickable(pick: int, name: str, url: str) -> None:
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


def open_storage(url: str, *, read_only: bool = False) -> optuna.storages.BaseStorage:
    """Open a storage.  Folders are created only for a journal (the default
    one under studies/; a --storage journal's folder was checked to exist);
    ``read_only`` (report, --pick) creates nothing: the file must exist, and
    sqlite is opened read-only."""
    path = _storage_path(url)
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
            # SQLite's own read-only mode: not even a table is created.
            url = f"sqlite:///file:{path.absolute()}?mode=ro&uri=true"
        # No heartbeat: Optuna runs it only under Study.optimize, and qtune
        # drives ask/tell; trials a killed run left RUNNING are failed on
        # resume instead (run_study).  SQLite gets a lock timeout.
        kwargs = {"connect_args": {"timeout": 20.0}} if url.startswith("sqlite") else {}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as exc:  # sqlalchemy/driver errors vary widely
        raise StudyError(
            f"cannot open storage {mask_url(url)}: {type(exc).__name__}: "
            f"{exc}".splitlines()[0][:300],
            hint="check the URL; PostgreSQL needs 'pip install psycopg2-binary'",
        ) from None


def tune(cfg: TuneConfig, reporter: Reporter | None = None) -> TuneResult:
    prep = prepare(cfg)
    return run_study(prep, reporter or NullReporter())


def run_study(prep: Prepared, reporter: Reporter) -> TuneResult:
    cfg = prep.cfg
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(prep.storage_url)
    try:
        # pareto: maximise throughput, minimise the latency percentile.
        dirs = ({"directions": ["maximize", "minimize"]} if prep.direction == "pareto"
                else {"direction": prep.direction})
        study = optuna.create_study(
            study_name=prep.study_name,
            storage=storage,
            **dirs,
            sampler=make_sampler(cfg.sampler, prep.params, cfg.seed, cfg.trials),
            load_if_exists=True,
        )
    except ValueError as exc:
        raise StudyError(
            f"study {prep.study_name}: {exc}",
            hint="a resumed study must keep its objective direction",
        ) from None
    _check_resume(study, prep)
    # Journal storage has no heartbeat: trials left RUNNING by a killed qtune
    # would bias the constant-liar sampler forever.  Fail them on resume.
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
    study.set_user_attr(StudyAttr.OBJECTIVE, cfg.objective)
    study.set_user_attr(StudyAttr.WORKLOAD, cfg.workload.to_dict())
    study.set_user_attr(StudyAttr.LEVELS, list(cfg.levels))
    study.set_user_attr(StudyAttr.EXACT, cfg.exact)
    study.set_user_attr(StudyAttr.MODEL, prep.ctx.model.summary())
    study.set_user_attr(StudyAttr.OPTUNA_VERSION, optuna.__version__)
    # What --pick needs to write a profile where the engine is not installed.
    study.set_user_attr(StudyAttr.ENGINE_INSTALL, dataclasses.asdict(prep.ctx.install))
    prep.study_dir.mkdir(parents=True, exist_ok=True)
    dists = distributions(prep.params)
    reporter.study_started({
        "study": prep.study_name,
        "storage": prep.storage_url,
        "model": prep.ctx.model.summary(),
        "engine": f"{prep.ctx.install.name} {prep.ctx.install.version} "
        f"({prep.ctx.install.build})",
        "space": {p.name: describe(p) for p in prep.params},
        "fixed": prep.fixed,
        "trials": cfg.trials,
        "time_budget": cfg.time_budget,
        "workload": cfg.workload.to_dict(),
        "levels": list(cfg.levels),
        "objective": cfg.objective,
        "slo": [str(s) for s in cfg.slo],
    })

    def launched_count() -> int:
        return sum(
            1 for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(Attr.STATUS) in LAUNCHED
            and Attr.SERVER_OF not in t.user_attrs  # --levels: no launch of its own
        )

    started = time.monotonic()
    stop_reason = None
    has_baseline = any(
        t.user_attrs.get(Attr.BASELINE) and (
            t.state == TrialState.COMPLETE
            # refused as too big: a resume does not ask again (unless the
            # memory check is now off)
            or (t.user_attrs.get(Attr.REASON) == "predicted_oom" and cfg.memory_check))
        for t in study.get_trials(deepcopy=False)
    )
    if not has_baseline and launched_count() < cfg.trials:
        base_params, note = prep.engine.baseline(prep.ctx)
        _run_unsampled(prep, study, reporter, {**base_params, **prep.fixed},
                       {Attr.BASELINE: True, **({Attr.BASELINE_NOTE: note} if note else {})})

    prep = _shape(prep, study, reporter)
    dists = distributions(prep.params)
    study.sampler = make_sampler(cfg.sampler, prep.params, cfg.seed, cfg.trials)

    def over_budget() -> str | None:
        """Start a trial only if a typical one still fits in the budget."""
        if cfg.time_budget is None:
            return None
        typical = _typical_trial_s(study)
        if time.monotonic() - started + typical <= cfg.time_budget:
            return None
        return (f"time budget: {cfg.time_budget / 60:.0f} min, a trial "
                f"takes ~{typical / 60:.1f} min")

    for point, why in _pending_seeds(prep, study):
        if launched_count() >= cfg.trials or (stop_reason := over_budget()):
            break
        # Param-less like the baseline: TPE's groups would otherwise split
        # its one param off from the rest.  The queue is empty here
        # (_pending_seeds), so ask() returns this trial.
        _run_unsampled(prep, study, reporter, {**point, **prep.fixed},
                       {Attr.SEED: why, Attr.SEED_POINT: point}, note=why)
    if not stop_reason and launched_count() < cfg.trials:
        # Queued only when the loop will take them: a queued point left over
        # would come out of a later ask() in place of what was queued then.
        _start_design(prep, study, reporter)

    invalid_run = 0
    while not stop_reason and launched_count() < cfg.trials:
        if invalid_run >= 25:
            # Every recent proposal was refused without a launch: what is left
            # of the space cannot start.  Stop rather than spin.
            stop_reason = "the last 25 proposals were all refused without a launch"
            break
        if stop_reason := over_budget():
            break
        if isinstance(study.sampler, optuna.samplers.GridSampler) and \
                study.sampler.is_exhausted(study):
            stop_reason = "every grid point has been tried"
            break
        trial = study.ask(dists)
        params = {**tidy(trial.params, prep.params), **prep.fixed}
        violations = prep.engine.check(params, prep.ctx)
        reason = "invalid_config"
        learned = _learned_refusal(study, params)
        if learned and not violations:
            violations, reason = [learned], "learned_oom"
        est = _estimate(prep, params)
        if est is not None:
            trial.set_user_attr(Attr.MEMORY_ESTIMATE, est.as_dict())
            if not est.fits and cfg.memory_check:
                violations.append("predicted not to fit: " + est.reason)
                reason = "predicted_oom"
        invalid_run = invalid_run + 1 if violations else 0
        if violations:
            _refuse(study, trial, params, reason, "; ".join(violations), reporter)
            continue
        _run_trial(prep, study, trial, params, reporter)

    if stop_reason:
        reporter.note(f"stopped before --trials: {stop_reason}")
    if prep.direction == "pareto" and cfg.confirm_top > 0 and cfg.pick is None:
        reporter.note("no top-K confirmation for a Pareto front: re-measure the point "
                      "you pick with qtune verify")
    elif cfg.confirm_top > 0 and cfg.confirm_repeats > 0 and cfg.pick is None:
        # + 1: the engine defaults are re-measured with the top K.
        need = min(cfg.confirm_top + 1, launched_count()) * cfg.confirm_repeats * \
            _typical_trial_s(study)
        if cfg.time_budget is not None and time.monotonic() - started + need > cfg.time_budget:
            reporter.note("confirmation of the top configs skipped: it does not fit "
                          "the time budget")
        else:
            confirm_top(prep, study, reporter)
    res = _finish(prep, study)
    res.stop_reason = stop_reason
    return res


def _run_unsampled(prep: Prepared, study: optuna.Study, reporter: Reporter,
                   params: dict[str, Any], attrs: dict[str, Any],
                   note: str | None = None) -> None:
    """Launch a trial no sampler chose (the baseline, an engine seed).  It is
    queued without params, so that no sampler spends one of its points on it
    (the grid sampler would otherwise assign it a grid cell) or models it;
    its launch params are kept in its attributes."""
    study.enqueue_trial({}, user_attrs=attrs)
    trial = study.ask()
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if note:
        reporter.note(f"trial {trial.number}: {note}")
    est = _estimate(prep, params)
    if est is not None:
        trial.set_user_attr(Attr.MEMORY_ESTIMATE, est.as_dict())
        if not est.fits and prep.cfg.memory_check:
            # The engine defaults can be too big for the host (a 70B model
            # at TP 1): minutes of loading weights only to fail.  Seeds are
            # filtered before this, so only the baseline gets here.
            _refuse(study, trial, params, "predicted_oom",
                    "predicted not to fit: " + est.reason, reporter)
            return
    _run_trial(prep, study, trial, params, reporter)


def _refuse(study: optuna.Study, trial: optuna.Trial, params: dict[str, Any], reason: str,
            detail: str, reporter: Reporter) -> None:
    """Record a config refused without a launch (pruned: TPE ranks it below
    every run, so it learns the region)."""
    rec = TrialRecord(trial.number, params, TrialStatus.INVALID, reason=reason, detail=detail)
    write_record(trial, rec)
    study.tell(trial, state=TrialState.PRUNED)
    reporter.trial_done(rec, _best(study))


def _learned_refusal(study: optuna.Study, params: dict[str, Any]) -> str | None:
    """A config that asks for at least the memory a failed start asked for
    (the engine said it asked for more than was free) fails the same way:
    refuse it without a launch.  Learned from launches, so it also covers
    what the memory estimate got wrong or was turned off for."""
    for t in study.get_trials(deepcopy=False):
        asked = t.user_attrs.get(Attr.OVER_REQUEST)
        if asked and all(k in params and params[k] >= v for k, v in asked.items()):
            what = ", ".join(f"{k}={v}" for k, v in asked.items())
            return (f"asks at least the memory of trial {t.number} ({what}), "
                    "which failed to start asking for more than was free")
    return None


def _shape(prep: Prepared, study: optuna.Study, reporter: Reporter) -> Prepared:
    """Let the engine narrow the space with the load and the defaults run.
    Computed from what the study stored, so a resumed study gets the same
    space (and the sampler the same distributions) as the first run."""
    fn = getattr(prep.engine, "shape", None)
    if fn is None:
        return prep
    base = next((t for t in study.get_trials(deepcopy=False)
                 if t.user_attrs.get(Attr.BASELINE) and t.state == TrialState.COMPLETE), None)
    wl = prep.cfg.workload
    load = LoadView(
        rate=wl.rate, concurrency=wl.concurrency if wl.rate is None else None,
        shared_prefix=bool(wl.prefix_count) or wl.dataset is not None,
        baseline=base.user_attrs.get(Attr.SUMMARY) if base else None,
        baseline_params=base.user_attrs.get(Attr.LAUNCH_PARAMS, {}) if base else {},
    )
    mine = [p for p in prep.params if p.name not in prep.user_set]
    kept, fixed, notes = fn(mine, prep.ctx, load)
    params = [p for p in prep.params if p.name in prep.user_set] + kept
    for n in notes:
        reporter.note(n)
    study.set_user_attr(StudyAttr.SPACE_NOTES, notes)
    return dataclasses.replace(prep, params=params, fixed={**fixed, **prep.fixed})


def _pending_seeds(prep: Prepared, study: optuna.Study) -> list[tuple[dict[str, Any], str]]:
    """The engine's informed first points (``seeds``) not yet run in this
    study, that are in the tuned space, valid and predicted to fit."""
    seeds = getattr(prep.engine, "seeds", None)
    if seeds is None or study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return []  # resumed with queued design points: those go first
    ran = [t.user_attrs.get(Attr.SEED_POINT) for t in study.get_trials(deepcopy=False)]
    tuned = {p.name for p in prep.params}
    out = []
    for point, why in seeds(prep.params, prep.ctx, prep.fixed):
        if point in ran or not set(point) <= tuned:
            continue
        full = {**point, **prep.fixed}
        est = _estimate(prep, full)
        if prep.engine.check(full, prep.ctx) or (
                est is not None and not est.fits and prep.cfg.memory_check):
            continue
        out.append((point, why))
    return out


def _start_design(prep: Prepared, study: optuna.Study, reporter: Reporter) -> None:
    """Model-based samplers start from a Latin hypercube instead of random
    points (see ``initial_design``); queued once, on a study's first run.
    When an engine seed beat the engine defaults, the design keeps the
    seed's values and spreads its few points over the other parameters."""
    cfg = prep.cfg
    if cfg.sampler not in ("tpe", "gp") or not prep.params:
        return
    if any(not (t.user_attrs.get(Attr.BASELINE) or t.user_attrs.get(Attr.SEED))
           for t in study.get_trials(deepcopy=False)):
        return  # resumed: the design was queued (and probably run) before
    n = startup_trials(cfg.trials)
    anchor, why = _seed_anchor(prep, study)
    free = [p for p in prep.params if p.name not in anchor]
    if not free:
        return  # every tuned parameter is the seed's: the design would repeat it

    def valid(point: dict[str, Any]) -> bool:
        full = {**tidy({**point, **anchor}, prep.params), **prep.fixed}
        if prep.engine.check(full, prep.ctx):
            return False
        est = _estimate(prep, full)
        return est is None or est.fits or not cfg.memory_check

    if anchor:
        what = ", ".join(f"{k}={v}" for k, v in anchor.items())
        reporter.note(f"the start design keeps the seed's {what} ({why}) and spreads "
                      "over the other parameters")
    for point in initial_design(free, n, cfg.seed, valid):
        attrs: dict[str, Any] = {Attr.DESIGN: "latin-hypercube"}
        if anchor:
            attrs[Attr.AROUND_SEED] = anchor
        study.enqueue_trial({**point, **anchor}, user_attrs=attrs)


# How much better than the engine defaults a seed must measure to anchor the
# start design: one run each, and a run varies by several percent (CPU VM:
# ~7%, benchmarks/noise_sources.py); the case it is for measured 4.7x.
_ANCHOR_MARGIN = 1.10


def _seed_anchor(prep: Prepared, study: optuna.Study) -> tuple[dict[str, Any], str]:
    """The point of the best engine seed that met the SLO and clearly beat
    the engine defaults (or the defaults did not run or missed the SLO), with
    why; else ({}, "").  A seed is the engine's informed guess; once measured
    better than the defaults (on 2xH200, one replica per GPU: p99 3.3 s
    against 15.8 s), a design of two or three points spent re-testing its
    parameter is spent where the answer is known, while the parameters it
    left at their defaults are untried.  The sampler stays free over the
    whole space after the design."""
    if prep.direction == "pareto":
        return {}, ""
    recs = [(TrialRecord.from_frozen(t), t.user_attrs)
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    base = next((r for r, _ in recs if r.baseline), None)
    sign = -1 if prep.direction == "maximize" else 1
    seeds = sorted(((r, a[Attr.SEED_POINT]) for r, a in recs
                    if a.get(Attr.SEED_POINT) and r.feasible and r.value is not None),
                   key=lambda ra: sign * ra[0].value)  # type: ignore[operator]
    if not seeds:
        return {}, ""
    best, point = seeds[0]
    if base is None or base.value is None:
        why = "the engine defaults did not run"
    elif not base.feasible:
        why = "the engine defaults missed the SLO"
    else:
        s, b = float(best.value), float(base.value)  # type: ignore[arg-type]
        gain = (b / s if sign > 0 else s / b) if min(s, b) > 0 else 0.0
        if gain < _ANCHOR_MARGIN:
            return {}, ""
        why = f"{gain:.1f}x better than the engine defaults"
    tuned = {p.name for p in prep.params}
    return {k: v for k, v in point.items() if k in tuned}, why


def _typical_trial_s(study: optuna.Study) -> float:
    """Median wall time of launched trials, the cold first start excluded
    when there are others (it is not what the next trial costs)."""
    done = [t.user_attrs[Attr.TOTAL_S] for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(Attr.TOTAL_S)]
    if len(done) > 1:
        done = done[1:]
    done.sort()
    return done[len(done) // 2] if done else 0.0


def confirm_top(prep: Prepared, study: optuna.Study, reporter: Reporter) -> None:
    """Re-measure the top K feasible configs with fresh starts, interleaved
    (ABC, BCA, CAB, ...), and keep the medians and bootstrap intervals in the
    study: one lucky measurement must not pick the winner.  The engine
    defaults are re-measured with them, so the improvement the profile claims
    compares medians taken in the same rounds, and the defaults win when
    nothing beats them again."""
    cfg = prep.cfg
    recs = [TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)]
    feas = [r for r in recs if r.feasible and r.value is not None and r.status == TrialStatus.OK]
    sign = -1 if prep.direction == "maximize" else 1
    top = sorted(feas, key=lambda r: sign * r.value)[: cfg.confirm_top]  # type: ignore[operator]
    # (On a CPU study a 2-run winner at 1.7x re-measured at 0.77x in verify:
    # a config can be lucky twice; the defaults' own spread is the yardstick.)
    top += [r for r in feas if r.baseline and r.number not in {t.number for t in top}][:1]
    if len(top) < 2:
        return  # nothing to choose between
    previous = study.user_attrs.get(StudyAttr.CONFIRMATION) or {}
    values: dict[int, list[float]] = {r.number: [] for r in top}
    failures: dict[int, int] = {r.number: 0 for r in top}
    for rep, r in interleaved(top, cfg.confirm_repeats):
        reporter.trial_phase(r.number, "confirming",
                             f"repeat {rep + 1}/{cfg.confirm_repeats}")
        spec = prep.engine.launch_spec(r.params, prep.ctx, host="127.0.0.1",
                                       port=free_port())
        log = prep.study_dir / f"confirm-{r.number:03d}-{rep}.log"
        wl = dataclasses.replace(cfg.workload, seed=cfg.workload.seed + 1 + rep)
        try:
            m = measure_server(spec, log, _bench_config(prep, spec, wl),
                               startup_timeout=cfg.startup_timeout,
                               classify=prep.engine.classify)
        except ServerError:
            failures[r.number] += 1  # does not restart reliably
            continue
        v = get_objective(cfg.objective).value(m.to_dict())
        if v is not None and m.failed == 0:
            values[r.number].append(v)
        else:
            failures[r.number] += 1
    result = {}
    for n, vals in values.items():
        first = study.trials[n].value
        assert first is not None  # top holds only trials with a value
        all_vals = [first, *vals]
        med, lo, hi = bootstrap_median([float(v) for v in all_vals])
        result[str(n)] = {"values": all_vals, "median": med, "failures": failures[n],
                          "ci95": [lo, hi] if lo is not None else None}
    study.set_user_attr(StudyAttr.CONFIRMATION, {**previous, **result})


def _estimate(prep: Prepared, params: dict[str, Any]) -> Any:
    fn = getattr(prep.engine, "estimate", None)
    if fn is None:
        return None
    try:
        return fn(params, prep.ctx)
    except (KeyError, ValueError, TypeError, ZeroDivisionError):
        return None  # an unusual config.json: no prediction rather than no study


def estimate_accuracy(trials: list[TrialRecord], attrs: dict[int, dict[str, Any]]
                      ) -> dict[str, Any]:
    """How the memory prediction compared with what launches did."""
    launched = [t for t in trials
                if t.status in LAUNCHED
                and Attr.MEMORY_ESTIMATE in attrs.get(t.number, {})]
    right = sum(1 for t in launched
                if attrs[t.number][Attr.MEMORY_ESTIMATE]["fits"] == (t.reason != "oom"))
    return {
        "launches_avoided": sum(1 for t in trials if t.reason == "predicted_oom"),
        "launched_with_prediction": len(launched),
        "prediction_right": right,
        "oom_at_start_despite_fit": sum(
            1 for t in launched
            if t.reason == "oom" and attrs[t.number][Attr.MEMORY_ESTIMATE]["fits"]),
    }


def _check_resume(study: optuna.Study, prep: Prepared) -> None:
    wl = study.user_attrs.get(StudyAttr.WORKLOAD)
    if wl is not None and wl != prep.cfg.workload.to_dict():
        raise StudyError(
            f"study {prep.study_name} was run with another workload",
            hint="use a new --study NAME, or the same load flags as before",
        )
    for key, now in (("levels", list(prep.cfg.levels)), ("exact", prep.cfg.exact)):
        before = study.user_attrs.get(key)
        if before is not None and before != now:
            raise StudyError(
                f"study {prep.study_name} was run with --{key} {before}, not {now}",
                hint="use a new --study NAME, or the same flags as before")
    obj = study.user_attrs.get(StudyAttr.OBJECTIVE)
    if obj is not None and obj != prep.cfg.objective:
        raise StudyError(
            f"study {prep.study_name} optimises {obj}, not {prep.cfg.objective}",
            hint="use a new --study NAME",
        )


def _run_trial(
    prep: Prepared,
    study: optuna.Study,
    trial: optuna.Trial,
    params: dict[str, Any],
    reporter: Reporter,
) -> None:
    try:
        lower = _run_trial_inner(prep, study, trial, params, reporter)
        for level, m in lower:
            _add_level_point(prep, study, trial, params, level, m, reporter)
    except BaseException:
        # Ctrl-C or SIGTERM mid-trial: the server is already stopped by its
        # context manager; close the trial so a resume does not see it RUNNING.
        try:
            study.tell(trial, state=TrialState.FAIL)
        except (ValueError, RuntimeError):
            pass  # already told
        raise


def _run_trial_inner(
    prep: Prepared,
    study: optuna.Study,
    trial: optuna.Trial,
    params: dict[str, Any],
    reporter: Reporter,
) -> list[tuple[float, Measurement]]:
    """Launch, measure, tell.  Returns the --levels points measured on this
    server below the study's load, for the caller to add as trials."""
    cfg = prep.cfg
    n = trial.number
    baseline = bool(trial.user_attrs.get(Attr.BASELINE))
    lower: list[tuple[float, Measurement]] = []
    t0 = time.monotonic()
    log_path = prep.study_dir / f"trial-{n:03d}.log"
    rec = TrialRecord(n, params, TrialStatus.OK, baseline=baseline, log=str(log_path))
    best = _best(study)
    capacity = cfg.objective == "capacity"
    watch = None if baseline or capacity else make_pruner(
        cfg, best.value if best and prep.direction != "pareto" else None)

    def ready(startup_s: float) -> None:
        rec.startup_s = startup_s

    def progress(text: str) -> None:
        reporter.trial_phase(n, "measuring", text)

    for attempt in range(3):
        port = free_port()
        spec = prep.engine.launch_spec(params, prep.ctx, host="127.0.0.1", port=port)
        rec.argv, rec.env = list(spec.argv), dict(spec.env)
        reporter.trial_phase(n, "starting", _short(params) or "engine defaults")

        def before(spec: Any = spec) -> None:
            nonlocal lower
            lower = _lower_levels(prep, spec, n, reporter) if cfg.levels else []
            reporter.trial_phase(n, "measuring", cfg.workload.mode)

        try:
            m = measure_server(
                spec, log_path, _bench_config(prep, spec, cfg.workload),
                startup_timeout=cfg.startup_timeout, classify=prep.engine.classify,
                progress=progress, watch=watch, capacity=capacity,
                on_tick=lambda s: reporter.trial_phase(n, "starting", f"{s:.0f} s"),
                on_ready=ready, before=before,
                # A server that died under load is a failed config, not a
                # slow one: checked before the numbers are trusted.
                check_alive=True)
            rec.measure_s = m.measure_s
            break
        except ServerError as exc:
            if isinstance(exc, ServerDied):
                rec.measure_s = exc.measurement.measure_s
            if exc.reason in _RETRYABLE and attempt < 2:
                continue
            rec.status = (TrialStatus.STARTUP_FAILED if rec.measure_s is None
                          else TrialStatus.LOAD_FAILED)
            rec.reason, rec.detail = exc.reason, exc.detail or exc.message
            asks = getattr(prep.engine, "memory_asks", None)
            knobs = asks(rec.detail or "") if asks and rec.measure_s is None else ()
            asked = {k: params[k] for k in knobs if k in params}
            if asked:  # what this start asked for: learned, see _learned_refusal
                trial.set_user_attr(Attr.OVER_REQUEST, asked)
            rec.total_s = time.monotonic() - t0
            write_record(trial, rec)
            study.tell(trial, state=TrialState.PRUNED)
            reporter.trial_done(rec, _best(study))
            return []  # a server that died: its lower levels are not kept either
    summary = m.to_dict()
    rec.summary = summary
    rec.total_s = time.monotonic() - t0
    if cfg.levels:
        rec.load_level = _level_of(cfg.workload)
        trial.set_user_attr(Attr.LOAD_LEVEL, rec.load_level)
    if m.stopped_early and m.stopped_early != "saturated":
        # Pruned mid-measurement: tell TPE how far it got, not a full value.
        done = m.completed + m.failed
        planned = cfg.workload.requests or done
        partial = get_objective(cfg.objective).value(summary)
        # Optuna has no intermediate values for multi-objective studies.
        if partial is not None and not math.isnan(partial) and prep.direction != "pareto":
            trial.report(partial, step=done)
        rec.status, rec.reason = TrialStatus.PRUNED, "pruned"
        # Percentiles over the requests that finished before the stop would
        # read better than the truth: keep them apart from real summaries.
        trial.set_user_attr(Attr.PARTIAL_SUMMARY, summary)
        rec.summary = None
        trial.set_user_attr(Attr.REQUESTS_UNSENT, max(planned - done, 0) / max(planned, 1))
        rec.detail = (f"{m.stopped_early} after {done}/{planned} requests")
        write_record(trial, rec)
        study.tell(trial, state=TrialState.PRUNED)
        reporter.trial_done(rec, _best(study))
        return lower
    for name, violation in _constraints(cfg, summary).items():
        trial.set_constraint(name, violation)
    write_record(trial, rec)
    values = _values(prep, summary)
    rec.value = values[-1]  # pareto: the latency
    if prep.direction == "pareto":
        rec.values = values
        study.tell(trial, values)
    else:
        study.tell(trial, values[0])
    rec.feasible = feasible(study.get_trials(deepcopy=False)[n])
    reporter.trial_done(rec, _best(study))
    return lower


def _constraints(cfg: TuneConfig, summary: dict[str, Any]) -> dict[str, float]:
    """A measured trial's constraints (feasible when all are <= 0): failed
    requests, and each SLO's violation."""
    out = {"failed_requests": float(summary["failed"])}
    if summary.get("contaminated"):
        # Measured on cached prefills: not the workload asked for, so it
        # may not win (qtune.bench.CONTAMINATED_HIT_RATE).
        out["contaminated"] = 1.0
    for slo in cfg.slo:
        out[str(slo)] = slo.violation(metric_value(summary, slo.metric))
    return out


def _values(prep: Prepared, summary: dict[str, Any]) -> list[float]:
    """What the study is told: [objective], or [throughput, latency] for
    pareto."""
    value = get_objective(prep.cfg.objective).value(summary)
    if value is None or math.isnan(value):
        # Nothing succeeded: no latency to rank.  Worst possible value keeps
        # the trial informative without a NaN (which Optuna marks FAIL).
        value = 0.0 if prep.direction == "maximize" else 1e12
    if prep.direction == "pareto":
        return [metric_value(summary, "throughput") or 0.0, value]
    return [value]


def _bench_config(prep: Prepared, spec: Any, wl: Any) -> Any:
    """How a trial measures ``wl`` on the server of ``spec``."""
    from qtune.bench import BenchConfig

    return BenchConfig(urls=[spec.base_url], workload=wl, model=spec.served_model,
                       tokenizer=prep.ctx.model.tokenizer_dir, slo=prep.cfg.slo)


def _level_of(wl: Any) -> float:
    return float(wl.rate if wl.rate is not None else wl.concurrency)


def _lower_levels(prep: Prepared, spec: Any, n: int,
                  reporter: Reporter) -> list[tuple[float, Measurement]]:
    """``--levels``: measure the levels below the study's load (its highest
    level) on the server already up, lightest first.  Sharing one server is
    valid here because nothing a level leaves behind changes the next: each
    level has its own warm-up and its own prompts (another seed, so prefix
    caching cannot reuse the previous level's), and every request of a level
    has finished before the next starts."""
    cfg = prep.cfg
    out = []
    for i, level in enumerate(sorted(cfg.levels)[:-1]):
        wl = dataclasses.replace(_at_load(cfg.workload, level),
                                 seed=cfg.workload.seed + 7919 * (i + 1))

        def progress(text: str, level: float = level) -> None:
            reporter.trial_phase(n, "measuring", f"level {level:g}: {text}")

        # Kept with the point: its own measuring time and when it ran (the
        # trial itself is only created once the launch's top level is told).
        out.append((level, measure_load(spec, _bench_config(prep, spec, wl),
                                        progress=progress)))
    return out


def _add_level_point(prep: Prepared, study: optuna.Study, trial: optuna.Trial,
                     params: dict[str, Any], level: float, m: Measurement,
                     reporter: Reporter) -> None:
    """One --levels point as a trial of its own: the same engine config (and
    sampled params) as ``trial``, whose server it shared."""
    frozen = study.get_trials(deepcopy=False)[trial.number]
    # "baseline" is copied on purpose: a point of the defaults' server is the
    # defaults at that load (the improvement at a level compares with it).
    attrs = {k: v for k, v in frozen.user_attrs.items()
             if k in (Attr.LAUNCH_PARAMS, Attr.ARGV, Attr.ENV, Attr.LOG, Attr.STARTUP_S,
                      Attr.BASELINE)}
    summary = m.to_dict()
    measured = {Attr.STARTED: m.started, Attr.FINISHED: m.finished,
                Attr.MEASURE_S: m.measure_s}
    attrs.update({Attr.STATUS: str(TrialStatus.OK), Attr.SUMMARY: summary,
                  Attr.LOAD_LEVEL: level, Attr.SERVER_OF: trial.number, **measured})
    study.add_trial(optuna.trial.create_trial(
        values=_values(prep, summary), params=frozen.params,
        distributions=frozen.distributions, user_attrs=attrs,
        constraints=_constraints(prep.cfg, summary)))
    # Found by its attributes, not as "the last trial": storage may be shared.
    added = next(TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)
                 if t.user_attrs.get(Attr.SERVER_OF) == trial.number
                 and t.user_attrs.get(Attr.LOAD_LEVEL) == level)
    reporter.trial_done(added, _best(study))


def _at_load(wl: Any, value: float | None) -> Any:
    import dataclasses

    if value is None:
        return wl
    if wl.concurrency is not None:
        return dataclasses.replace(wl, concurrency=int(value))
    return dataclasses.replace(wl, rate=value)


def _short(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _best(study: optuna.Study, pick: int | None = None) -> TrialRecord | None:
    """The best feasible trial; ``pick`` chooses one by number instead.  For
    a Pareto study, the knee of the front (see ``knee``)."""
    recs = [TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)]
    feas = [r for r in recs if r.feasible and r.value is not None]
    if pick is not None:
        return next((r for r in feas if r.number == pick and r.status == TrialStatus.OK), None)
    if not feas:
        return None
    if len(study.directions) > 1:
        return knee(pareto_front(feas))
    sign = -1 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1
    return min(feas, key=lambda r: sign * r.value)  # type: ignore[operator]


def winner(study: optuna.Study, pick: int | None = None) -> TrialRecord | None:
    """The trial a study's profile is written from, for the search and
    ``qtune report`` alike: trial ``pick`` when given; else, once the top
    configs were re-measured, the best *median* over the confirmation
    repeats; else the best single run (``_best``)."""
    best = _best(study, pick)
    confirmation = study.user_attrs.get(StudyAttr.CONFIRMATION) or {}
    if best is None or not confirmation or pick is not None:
        return best
    maximize = len(study.directions) == 1 and \
        study.direction == optuna.study.StudyDirection.MAXIMIZE
    sign = -1 if maximize else 1
    # A config whose re-run failed (start or requests) cannot win while
    # another re-ran cleanly.
    clean = [k for k, c in confirmation.items() if not c.get("failures")]
    n = min(clean or list(confirmation), key=lambda k: sign * confirmation[k]["median"])
    return next(TrialRecord.from_frozen(t) for t in ran_trials(study) if t.number == int(n))


def pareto_front(recs: list[TrialRecord]) -> list[TrialRecord]:
    """Trials no other trial beats on both throughput and latency, by
    throughput (ascending)."""
    pts = [r for r in recs if r.values]
    front = [r for r in pts if not any(
        o.values[0] >= r.values[0] and o.values[1] <= r.values[1]  # type: ignore[index]
        and o.values != r.values for o in pts)]
    return sorted(front, key=lambda r: r.values[0])  # type: ignore[index]


def knee(front: list[TrialRecord]) -> TrialRecord | None:
    """The front point with the most throughput for its latency: the largest
    normalised throughput minus normalised latency.  The ends of the front
    (all throughput, or all latency) are what ``--pick`` is for."""
    if not front:
        return None
    thr = [r.values[0] for r in front]  # type: ignore[index]
    lat = [r.values[1] for r in front]  # type: ignore[index]

    def norm(v: float, vs: list[float]) -> float:
        return (v - min(vs)) / (max(vs) - min(vs)) if max(vs) > min(vs) else 0.0

    best = max(range(len(front)), key=lambda i: norm(thr[i], thr) - norm(lat[i], lat))
    return front[best]


def _finish(prep: Prepared, study: optuna.Study) -> TuneResult:
    cfg = prep.cfg
    trials = [TrialRecord.from_frozen(t) for t in ran_trials(study)]
    _export_trials(study, prep.study_dir / "trials.csv")
    best = winner(study, cfg.pick)
    feasible = [r for r in trials if r.feasible and r.status == TrialStatus.OK]
    front = pareto_front(feasible) if prep.direction == "pareto" else []
    front_view = _front_view(front, pareto_latency(cfg.objective) or "") if front else None
    if cfg.pick is not None and best is None:
        choices = [r.number for r in (front or feasible)]
        raise InputError(
            f"--pick {cfg.pick}: trial {cfg.pick} of study {prep.study_name} is not a "
            "fully measured, feasible trial",
            hint=("pick one of trials " + ", ".join(map(str, choices))) if choices
            else "no trial can be picked yet: run more trials",
        )
    # With --levels, the defaults at the best point's own load.
    level = best.load_level if best is not None else None
    baseline = next((r for r in trials if r.baseline and r.status == TrialStatus.OK
                     and r.load_level == level), None)
    baseline = baseline or next((r for r in trials if r.baseline), None)
    improvement = None
    pair = _objective_pair(study, best, baseline) if best is not None else {}
    if best and baseline and baseline.value and best.value is not None:
        b, w = pair["baseline"], pair["best"]
        if prep.direction in ("minimize", "pareto"):  # pareto: its latency
            improvement = b / w if w else None
        else:
            improvement = w / b
    profile = path = None
    if best is not None:
        profile = build_profile(prep, study, best, baseline, len(trials),
                                {**pair, "improvement": improvement}, front_view)
        # absolute(), not resolve(): a link is refused (checked), not followed.
        path = (cfg.out or (cfg.profiles_dir / f"{prep.study_name}.yaml")).absolute()
        write_atomic(path, profile.dump(), force=cfg.force, what="--out")
    attrs = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    accuracy = estimate_accuracy(trials, attrs)
    # Saved time, estimated: the share of each pruned trial's requests never
    # sent, times what a full measurement takes (median over unpruned trials).
    full = sorted(t.measure_s for t in trials
                  if t.status == TrialStatus.OK and t.measure_s and t.server_of is None)
    typical = full[len(full) // 2] if full else 0.0
    unsent = [a[Attr.REQUESTS_UNSENT] for a in attrs.values() if Attr.REQUESTS_UNSENT in a]
    pruning = {"pruned": len(unsent),
               "measure_s_saved": round(sum(unsent) * typical, 3)}
    return TuneResult(prep.study_name, prep.storage_url, best, baseline, trials,
                      path, profile, improvement, accuracy, pruning, pareto_front=front_view)


def _front_view(front: list[TrialRecord], latency: str) -> list[dict[str, Any]]:
    return [{"trial": r.number, "throughput": r.values[0],  # type: ignore[index]
             latency: r.values[1], "params": r.params,  # type: ignore[index]
             **({"load": r.load_level} if r.load_level is not None else {})}
            for r in front]


def trials_frame(study: optuna.Study) -> Any:
    """The trials as a table: the CSV next to the study and `qtune report`'s."""
    import pandas as pd

    rows = []
    for t in ran_trials(study):
        r = TrialRecord.from_frozen(t)
        s = r.summary or {}
        row: dict[str, Any] = {
            "trial": r.number, "baseline": r.baseline, "status": str(r.status),
            "reason": r.reason, "value": r.value, "feasible": r.feasible,
            # A failure's detail is a line of the server's log: masked like
            # every text qtune writes (a token in a log line stays out).
            "startup_s": r.startup_s, "measure_s": r.measure_s,
            "detail": redact(r.detail) if r.detail else r.detail,
        }
        if r.load_level is not None:  # --levels: the load, and whose server
            row["load_level"], row["server_of"] = r.load_level, r.server_of
        row.update({f"param.{k}": v for k, v in r.params.items()})
        for m in ("ttft", "tpot", "itl", "e2e"):
            for p in ("p50", "p90", "p99"):
                row[f"{m}_{p}_ms"] = (s.get(f"{m}_ms") or {}).get(p)
        row["req_per_s"] = s.get("request_throughput")
        row["out_tok_per_s"] = s.get("output_token_throughput")
        row["failed"] = s.get("failed")
        rows.append(row)
    if not rows:  # a study with no trial yet: the columns, no rows
        return pd.DataFrame(columns=["trial", "baseline", "status", "reason", "value",
                                     "feasible", "startup_s", "measure_s", "detail",
                                     "req_per_s", "out_tok_per_s", "failed"])
    return pd.DataFrame(rows)


def _export_trials(study: optuna.Study, path: Path) -> None:
    # qtune's own file under studies/: replaced even if read-only, but never
    # through a link or over a device (write_atomic checks).
    write_atomic(path, trials_frame(study).to_csv(index=False), force=True,
                 what="trials table")


def _metrics_view(rec: TrialRecord | None) -> dict[str, Any] | None:
    if rec is None or rec.summary is None:
        return None
    s = rec.summary
    view: dict[str, Any] = {"trial": rec.number}
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        if s.get(m):
            view[m] = {k: round(v, 3) for k, v in s[m].items()}
    for k in ("request_throughput", "output_token_throughput"):
        view[k] = round(s[k], 4)
    view.update({k: s[k] for k in ("completed", "failed", "truncated")})
    return view


def _spread(conf: dict[str, Any]) -> tuple[float, float]:
    if conf.get("ci95"):
        lo, hi = conf["ci95"]
        return float(lo), float(hi)
    vals = conf.get("values") or [conf["median"]]
    return float(min(vals)), float(max(vals))


def _objective_pair(study: optuna.Study, best: TrialRecord,
                    baseline: TrialRecord | None) -> dict[str, Any]:
    """The winner's and the defaults' objective as the improvement compares
    them: the medians of the confirmation rounds when both were re-measured
    (the winner is picked by median, so its first run may be worse than the
    defaults' first run), else each one's single run."""
    conf = study.user_attrs.get(StudyAttr.CONFIRMATION) or {}
    if baseline is not None and str(best.number) in conf and str(baseline.number) in conf:
        w, b = conf[str(best.number)], conf[str(baseline.number)]
        out = {"best": w["median"], "baseline": b["median"],
               "basis": "median of the confirmation runs"}
        if best.number != baseline.number:
            # Overlapping intervals (or, under 3 runs, ranges): the gain is
            # within this host's noise (seen on CPU: 1.05x here, then
            # 1.00x [0.87, 1.32] in verify).
            (wl, wh), (bl, bh) = _spread(w), _spread(b)
            out["separated"] = bool(wh < bl or bh < wl)
        return out
    return {"best": best.value, "baseline": baseline.value if baseline else None,
            "basis": "one run each"}


def _as_ran(study: optuna.Study, rec: TrialRecord) -> Any:
    """A picked trial's launch as it ran (its command and env from the
    study), on the deployed port: --pick needs no engine installed."""
    from types import SimpleNamespace

    a = study.get_trials(deepcopy=False)[rec.number].user_attrs
    argv = list(a.get(Attr.ARGV) or [])
    if "--port" in argv[:-1]:
        argv[argv.index("--port") + 1] = "8000"
    return SimpleNamespace(argv=argv, env=dict(a.get(Attr.ENV) or {}))


def build_profile(
    prep: Prepared,
    study: optuna.Study,
    best: TrialRecord,
    baseline: TrialRecord | None,
    n_trials: int,
    objective: dict[str, Any],
    pareto_front: list[dict[str, Any]] | None = None,
) -> Profile:
    """``objective``: best, baseline, basis and improvement, as ``_finish``
    compared them (``_objective_pair``)."""
    cfg = prep.cfg
    # The trial ran on a random port; the deployed server gets a fixed one.
    spec = prep.engine.launch_spec(best.params, prep.ctx, host="127.0.0.1", port=8000) \
        if cfg.pick is None else _as_ran(study, best)
    notes = []
    if prep.ctx.model.load_format == "dummy":
        notes.append("tuned with random weights (--load-format dummy): swap in the "
                     "real checkpoint folder before serving real traffic")
    if baseline and baseline.status == TrialStatus.INVALID:
        notes.append(f"baseline (engine defaults) not launched: {baseline.detail}")
    elif baseline and baseline.status != TrialStatus.OK:
        notes.append(f"baseline (engine defaults) failed to start: {baseline.reason}: "
                     f"{baseline.detail}")
    base_note = study.trials[baseline.number].user_attrs.get(Attr.BASELINE_NOTE) \
        if baseline else None
    if base_note:
        notes.append(base_note)
    if objective.get("separated") is False:
        notes.append("the winner's confirmation runs overlap the engine defaults': the "
                     "improvement is within this host's run-to-run noise; qtune verify "
                     "--repeat 5 measures it with more starts")
    return Profile(
        name=prep.study_name,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        qtune_version=__version__,
        engine=EngineInfo(name=prep.ctx.install.name, version=prep.ctx.install.version,
                          build=prep.ctx.install.build),
        model=prep.ctx.model.summary(),
        params=dict(best.params),
        env=dict(spec.env),
        argv=list(spec.argv),
        metrics={
            "objective": {"name": cfg.objective, "direction": prep.direction,
                          **objective},
            "best": _metrics_view(best),
            "baseline": _metrics_view(baseline),
            "startup_s": best.startup_s,
            "confirmation": study.user_attrs.get(StudyAttr.CONFIRMATION) or None,
            "pareto_front": pareto_front,
        },
        # A --levels point is a profile for the load it was measured at.
        workload=(cfg.workload if best.load_level is None
                  else _at_load(cfg.workload, best.load_level)).to_dict(),
        slo=[str(s) for s in cfg.slo],
        host=prep.host.fingerprint(),
        placement=placement(prep.host, gpus_used(prep.engine, best.params)),
        # A profile is passed around: never the storage's password.
        study=StudyRef(storage=mask_url(prep.storage_url), name=prep.study_name,
                       trial=best.number, trials_run=n_trials,
                       baseline_trial=baseline.number if baseline else None),
        notes=notes,
    )
