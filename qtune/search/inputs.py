"""Everything that can fail because of the input, checked before any trial
or file is created (``prepare``), and the ``Prepared`` study it gives."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qtune.engines import get_engine
from qtune.engines import probe_host as probe
from qtune.engines.base import Engine, Param, SpaceContext
from qtune.errors import EngineError, InputError
from qtune.files import check_target
from qtune.host import HostFacts
from qtune.host.installed import EngineInstall
from qtune.load.workload import Workload
from qtune.model import ModelInfo, resolve_model
from qtune.objectives import get_objective
from qtune.search.config import (
    STUDY_NAME_MAX,
    SpaceOverride,
    TuneConfig,
    apply_overrides,
    check_config,
    check_levels,
    check_study_name,
    load_space_file,
)
from qtune.search.fleet import is_fleet, pin_gpus
from qtune.search.space import SAMPLERS, make_sampler
from qtune.search.storage import (
    check_pickable,
    check_storage_url,
    open_storage,
    recorded_install,
    storage_path,
    study_files,
)


@dataclass
class Prepared:
    """A study checked and ready to run: what ``prepare`` found, passed to
    every step of the run.  Built once; the runner's ``_shape`` replaces it
    (``dataclasses.replace``) with the space the engine narrowed, so a step
    reads ``params`` and ``fixed`` from the copy it was handed."""

    cfg: TuneConfig  # the flags (with --levels: the load at the top level)
    host: HostFacts  # the probe
    engine: Engine
    ctx: SpaceContext  # host, model, installed engine, its arguments
    params: list[Param]  # the tuned space
    fixed: dict[str, Any]  # params every launch gets (--space, the engine's shaping)
    direction: str  # "minimize", "maximize" or "pareto"
    study_name: str
    storage_url: str
    study_dir: Path  # the study's folder: logs, trials.csv
    user_set: frozenset[str] = frozenset()  # named in --space: never reshaped
    # --engine a,b: each engine's own study (space, context, install), by
    # name in the order given; empty for a study of one engine.  This one's
    # engine, ctx, params and fixed are then the first engine's.
    engines: dict[str, Prepared] = field(default_factory=dict)
    # Why lossy options are left out of the space when --exact was not given
    # (their quality cannot be measured here), for the study's notes.
    lossless_why: str | None = None

    def of(self, engine: str | None) -> Prepared:
        """The prepared study of ``engine`` (a trial's ``engine``): this one
        for a study of one engine, or a trial that names none."""
        return self.engines.get(engine, self) if engine else self


# The samplers that model the engine as a categorical parameter with a
# sub-space per engine: TPE (group=True models each engine's sub-space) and
# random sampling.  The grid, GP and NSGA-II need one fixed space.
MULTI_ENGINE_SAMPLERS = ("tpe", "random")


def engine_names(raw: str) -> list[str]:
    """``--engine``: one name, or several separated by commas, each a
    registered engine, each once."""
    names = [n.strip() for n in raw.split(",")]
    if not all(names):
        raise InputError(f"--engine {raw!r}: an empty engine name",
                         hint="name engines separated by commas, e.g. --engine vllm,sglang")
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise InputError(f"--engine {raw}: {twice} is named twice",
                         hint="name each engine once, e.g. --engine vllm,sglang")
    for n in names:
        get_engine(n)
    return names


def prepare(cfg: TuneConfig, *, host: HostFacts | None = None) -> Prepared:
    """Everything that can fail because of the input, checked before any
    trial or file is created.  ``host``: the probe, when the caller made it
    (one probe for the engines of ``--engine a,b``)."""
    names = engine_names(cfg.engine)
    if len(names) > 1:
        return _prepare_engines(cfg, names)
    # Order: the flags, then the files they name, then the model, then the
    # host (the probe runs --engine-python), then storage and the study,
    # and only then the engine: nothing is created or started for an input
    # that is refused.
    check_config(cfg)
    objective = get_objective(cfg.objective)
    engine = get_engine(cfg.engine)
    _check_files(cfg)
    override = load_space_file(cfg.space_file) if cfg.space_file else None
    model = resolve_model(cfg.model)
    _check_workload(cfg, model, objective.needs_slo)
    if cfg.levels:
        cfg = _with_levels(cfg, objective.direction)
    # --gpus: this worker's own GPUs (locked on the host), the only ones its
    # space is built for and its servers see.
    if host is None:
        host = pin_gpus(probe(engine_python=cfg.engine_python), cfg.fleet.gpus)
    study_name = cfg.study or _default_study_name(model, cfg, host)
    storage_url, study_dir = study_files(cfg, study_name)
    if cfg.pick is not None:
        if cfg.study is None:  # (a named study was checked in _check_files)
            check_pickable(cfg.pick, study_name, storage_url)
        # A re-pick launches nothing: the study's trials are all there is.
        cfg = dataclasses.replace(cfg, trials=0,
                                  confirm=dataclasses.replace(cfg.confirm, top=0))
    install = _install(cfg, host, storage_url, study_name)
    engine_args = engine.read_args(install) if cfg.pick is None else None
    exact, why = lossless(cfg, engine, model)
    if exact != cfg.quality.exact:
        cfg = dataclasses.replace(cfg, quality=dataclasses.replace(cfg.quality, exact=exact))
    ctx = SpaceContext(host, model, install, cfg.max_model_len, engine_args,
                       exact=cfg.quality.exact)
    params, fixed, why = _space(cfg, engine, ctx, override, why)
    user_set = frozenset(override.entries) if override is not None else frozenset()
    return Prepared(cfg, host, engine, ctx, params, fixed, objective.direction, study_name,
                    storage_url, study_dir, user_set, lossless_why=why)


def _check_files(cfg: TuneConfig) -> None:
    """The sampler's name and the files the flags name (--out, --storage, a
    named study's files, a re-picked study), before the probe: a typo costs
    no probe and no engine check."""
    if cfg.sampler not in SAMPLERS:
        raise InputError(f"--sampler: unknown sampler {cfg.sampler!r}",
                         hint="choose one of " + ", ".join(SAMPLERS))
    if cfg.out is not None:
        check_target(cfg.out, "--out", force=cfg.force)
    if cfg.storage:
        check_storage_url(cfg.storage)
        if storage_path(cfg.storage) is None and not cfg.storage.startswith("sqlite"):
            # A database server: connect now (driver missing, wrong password)
            # rather than after the probe and the engine check.
            open_storage(cfg.storage)
    if cfg.study is not None:
        # A named study's files are known now: check them before the probe.
        url, _ = study_files(cfg, cfg.study)
        if cfg.out is not None:  # again, now that the study's files are known inputs
            check_target(cfg.out, "--out", force=cfg.force)
        if cfg.pick is not None:
            # A re-pick reads a finished study: refuse a missing one before
            # anything else (no probe, no engine needed to say so).
            check_pickable(cfg.pick, cfg.study, url)


def _check_workload(cfg: TuneConfig, model: ModelInfo, needs_slo: bool) -> None:
    """The workload against the model's context, and the SLO the objective needs."""
    need = cfg.workload.max_total_len
    mml = cfg.max_model_len or model.max_context
    if cfg.workload.dataset is None and need > mml:
        raise InputError(
            f"the longest request (prefix + --input-len + --output-len = {need} "
            f"tokens) exceeds the model's context length {mml}",
            hint="shorten the workload or raise --max-model-len",
        )
    if needs_slo and not [s for s in cfg.slo if s.metric != "throughput"]:
        raise InputError(f"--objective {cfg.objective} needs a latency --slo",
                         hint="e.g. --slo 'ttft_p99<=500ms,tpot_p99<=50ms'")


def _install(cfg: TuneConfig, host: HostFacts, storage_url: str,
             study_name: str) -> EngineInstall:
    """The engine install the study launches: the probed one, or for a
    re-pick the one the study recorded; refused when it cannot serve here."""
    install = host.engines.get(cfg.engine)
    if install is None and cfg.pick is not None:
        # A re-pick writes the profile of a trial that ran: the engine that
        # ran it, as the study recorded it, and the trial's own command.
        install = recorded_install(storage_url, study_name)
    if install is None:
        raise _not_installed(cfg.engine, host)
    if install.build == "cuda" and not host.gpus and cfg.pick is None:
        raise EngineError(
            f"{cfg.engine} {install.version} is a CUDA build but no NVIDIA GPU is visible",
            hint=host.gpu.note or "install the CPU build: pip install 'qtune[cpu]'",
        )
    return install


def _space(cfg: TuneConfig, engine: Engine, ctx: SpaceContext,
           override: SpaceOverride | None, lossless_why: str | None
           ) -> tuple[list[Param], dict[str, Any], str | None]:
    """The searched params, the fixed ones (the space file's and those the
    compile cache's key would follow), and why lossy options were left out
    (None when the space would have held none)."""
    params = engine.space(ctx)
    why = lossless_why
    if why is not None:
        # Said only where the space would have held a lossy option.
        left_out = {p.name for p in engine.space(dataclasses.replace(ctx, exact=False))} \
            - {p.name for p in params}
        why = f"{why}: {', '.join(sorted(left_out))}" if left_out else None
    fixed: dict[str, Any] = {}
    if override is not None:
        params, fixed = apply_overrides(params, override, ctx.engine_args)
    named = override.entries if override is not None else {}
    params = [p for p in params if not p.opt_in or p.name in named]
    # What would follow a searched value into the compile cache's key is
    # fixed when it is not searched itself (issue 27: cheaper starts).
    fixed = {**engine.pinned_for_cache(params, fixed, ctx), **fixed}
    make_sampler(cfg.sampler, params, cfg.seed, cfg.trials)  # fail before any file
    return params, fixed, why


def lossless(cfg: TuneConfig, engine: Engine, model: ModelInfo) -> tuple[bool, str | None]:
    """Whether the space keeps the model's numerics, and why when the user
    did not ask for it: a lossy option (fp8 weights, fp8 KV cache) is
    searched only where the quality gate can judge it (real weights and an
    engine that answers log-probabilities), or with --lossy.  Issue 27: on
    one H200 the winner was fp8 weights on random weights, a quantization
    whose quality nobody had measured."""
    if cfg.quality.exact or cfg.quality.lossy:
        return cfg.quality.exact, None
    if model.load_format == "dummy":
        return True, ("fp8 weights and KV cache left out: the model has random weights, "
                      "so their answer quality cannot be measured (--lossy searches "
                      "them anyway)")
    if engine.logprobs_request(model.served_name, "") is None:
        return True, (f"fp8 weights and KV cache left out: {engine.name} answers no "
                      "log-probabilities, so their answer quality cannot be measured "
                      "(--lossy searches them anyway)")
    return False, None


def _not_installed(name: str, host: HostFacts) -> EngineError:
    """``name`` is not installed where the probe looked (``--engine-python``)."""
    return EngineError(
        f"{name} is not installed for {host.engines.python}"
        + (f" ({host.engines.error})" if host.engines.error else ""),
        hint=get_engine(name).install_hint())


def _prepare_engines(cfg: TuneConfig, names: list[str]) -> Prepared:
    """``--engine a,b``: each engine prepared as its own study would be
    (its install, arguments and space), under one study name, on one probe.
    What this first version does not search across engines is refused here,
    before anything is probed or created."""
    cfg = dataclasses.replace(cfg, engine=",".join(names))
    flag = f"--engine {cfg.engine}"
    if cfg.storage and is_fleet(cfg.storage):
        raise InputError(f"{flag}: a fleet (database storage) runs one engine per study",
                         hint="search across engines on one host (journal or sqlite "
                         "storage), or run one fleet study per engine")
    if cfg.pick is not None:
        raise InputError(f"{flag}: --pick re-picks from a study of one engine",
                         hint="read the study with qtune report; its profile names "
                         "the winner's engine")
    if cfg.sampler not in MULTI_ENGINE_SAMPLERS:
        raise InputError(f"{flag}: --sampler {cfg.sampler} needs one fixed space",
                         hint="use --sampler " + " or ".join(MULTI_ENGINE_SAMPLERS))
    if cfg.space_file is not None:
        raise InputError(f"{flag}: a --space file names one engine's flags",
                         hint="search one engine with its --space file, or drop --space")
    if get_objective(cfg.objective).direction == "pareto" or cfg.levels:
        raise InputError(f"{flag}: a Pareto search (--levels) runs one engine",
                         hint="use a single objective, e.g. --objective e2e_p99")
    check_config(cfg)
    host = pin_gpus(probe(engine_python=cfg.engine_python), cfg.fleet.gpus)
    # Every engine is installed, or none is asked anything (its arguments).
    for n in names:
        if host.engines.get(n) is None:
            raise _not_installed(n, host)
    # Every engine is checked (installed, arguments read) before any file.
    subs = {n: prepare(dataclasses.replace(cfg, engine=n), host=host) for n in names}
    first = subs[names[0]]
    study_name = cfg.study or _default_study_name(first.ctx.model, cfg, host)
    storage_url, study_dir = study_files(cfg, study_name)
    for n, sub in subs.items():
        subs[n] = dataclasses.replace(sub, study_name=study_name,
                                      storage_url=storage_url, study_dir=study_dir)
    return dataclasses.replace(subs[names[0]], cfg=dataclasses.replace(
        first.cfg, engine=cfg.engine), engines=subs)


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
    return dataclasses.replace(cfg, levels=levels, workload=at_load(
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


def at_load(wl: Workload, value: float | None) -> Workload:
    """``wl`` at another load: streams in a closed loop, else req/s."""
    if value is None:
        return wl
    if wl.concurrency is not None:
        return dataclasses.replace(wl, concurrency=int(value))
    return dataclasses.replace(wl, rate=value)
