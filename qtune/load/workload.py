"""What load to send: request shapes (lengths, dataset, shared prefixes),
arrivals (Poisson with burstiness, constant rate, fixed concurrency), bounds
and warm-up.  Shared by ``qtune bench`` and ``qtune search``; a workload can
come from flags or from a ``--workload FILE.yaml`` with the same keys.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from qtune.errors import InputError
from qtune.load.datasets import BUILTIN_DATASETS, dataset_file, load_dataset
from qtune.yamlfile import read_mapping


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: ``256`` fixed, ``128-512`` uniform,
    ``normal:256:64`` normal (clipped to at least 1)."""

    kind: str
    a: int
    b: int = 0

    @classmethod
    def parse(cls, value: int | str, flag: str) -> Lengths:
        text = str(value).strip()
        try:
            # ASCII digits (re.A): int() would take '٣' that no engine flag does.
            if re.fullmatch(r"\d+", text, re.A):
                n = int(text)
                if n >= 1:
                    return cls("fixed", n)
            elif m := re.fullmatch(r"(\d+)\s*[-:]\s*(\d+)", text, re.A):
                lo, hi = int(m[1]), int(m[2])
                if 1 <= lo <= hi:
                    return cls("uniform", lo, hi)
            elif m := re.fullmatch(r"normal:(\d+):(\d+)", text, re.A):
                return cls("normal", int(m[1]), int(m[2]))
        except ValueError:
            pass
        raise InputError(
            f"{flag}: cannot read {text!r}",
            hint="a token count: 256 (fixed), 128-512 (uniform) or normal:256:64",
        )

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.randint(self.a, self.b)
        return max(1, round(rng.gauss(self.a, self.b)))

    @property
    def max(self) -> int:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return self.b
        return self.a + 4 * self.b  # beyond 4 sigma: practically never

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else float(self.a)

    def __str__(self) -> str:
        return {"fixed": f"{self.a}", "uniform": f"{self.a}-{self.b}",
                "normal": f"normal:{self.a}:{self.b}"}[self.kind]


# A p99 over fewer requests is mostly its one or two slowest.
DEFAULT_REQUESTS = 200
# Without --rate or --concurrency: a few streams, so that a server's batching
# shows at all (one stream measures a batch of one).
DEFAULT_CONCURRENCY = 4
# Enough to run each of the default streams through a few requests before the
# measured window (first-request compiles and cache fills are not measured).
DEFAULT_WARMUP = 16
# A 4k-token generation at 10 tok/s (a 4B model on a few CPU cores) takes
# 400 s: a request may take minutes and still be alive.
DEFAULT_REQUEST_TIMEOUT = 600.0
# Between two chunks of a stream a server sends one token's worth of work:
# tens of ms on a GPU, about a second on a slow CPU at full batch.  A minute
# with no byte at all is a dead stream.
DEFAULT_STALL_TIMEOUT = 60.0
ARRIVALS = ("poisson", "constant")  # with a rate
ENDPOINTS = ("completions", "chat")
# Below one request in ~17 minutes a run of any useful length never ends, and
# 1e-300 req/s would sleep "forever"; above 100,000 req/s no client on one
# event loop keeps its send schedule.
MIN_RATE, MAX_RATE = 0.001, 100_000.0
# Gamma shape: 0.01 is a coefficient of variation of 10 (bursts of hundreds
# at once), 100 one of 0.1 (nearly constant); beyond either the gaps stop
# meaning "burstiness" and gammavariate returns denormals or a clock.
MIN_BURSTINESS, MAX_BURSTINESS = 0.01, 100.0


def _number(value: Any, flag: str, hint: str) -> float:
    """A finite real number (not a bool, not text) or an InputError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{flag}: {value!r} is not a number", hint=hint)
    if not math.isfinite(value):
        raise InputError(f"{flag}: {value!r} is not a finite number", hint=hint)
    return float(value)


def _whole(value: Any, flag: str, hint: str) -> int:
    """A whole number (not a bool, not 1.5, not text) or an InputError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{flag}: {value!r} is not a whole number", hint=hint)
    return value


@dataclass(frozen=True)
class Workload:
    input_len: int | str = 256
    output_len: int | str = 64
    rate: float | None = None  # requests/s
    # fixed number of streams; None: DEFAULT_CONCURRENCY unless a rate is given
    concurrency: int | None = None
    # None: DEFAULT_REQUESTS when no --duration is given, else unbounded (a
    # duration bound alone runs for the duration).
    requests: int | None = None
    duration: float | None = None  # seconds; whichever bound comes first
    warmup_requests: int = DEFAULT_WARMUP
    seed: int = 0
    endpoint: str = "completions"
    arrival: str = "poisson"  # with --rate: poisson | constant
    burstiness: float = 1.0  # gamma shape of inter-arrivals (1 = Poisson)
    dataset: str | None = None  # ShareGPT JSON or JSONL {prompt, output_tokens}
    prefix_count: int = 0  # shared-prefix workload: N distinct system prompts
    prefix_len: int = 0  # ... of this many tokens each
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT  # seconds, whole request
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # seconds without a byte mid-stream
    _lengths: tuple[Lengths, Lengths] = field(
        default=(Lengths("fixed", 1), Lengths("fixed", 1)), repr=False, compare=False
    )
    # Where the send times come from, when not from ``seed`` (the prompts'):
    # probes that share their bursts and not their prompts, for the
    # benchmarks that measure how much a verdict follows the send times
    # (verdict_noise.py, capacity_fast_vs_full.py --shared-arrivals).  qtune's
    # own phases leave it None.  Not a user's key: no file or flag sets it.
    _arrival_seed: int | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Types first: a workload file's "rate: fast" or "requests: 1.5" must
        # be one clear line, not a TypeError three calls later.
        for name, flag, hint in (
            ("requests", "--requests", "measured requests, e.g. 200"),
            ("concurrency", "--concurrency", "streams in flight, e.g. 4"),
        ):
            if getattr(self, name) is not None:
                _whole(getattr(self, name), flag, hint)
        for name, flag, hint in (
            ("warmup_requests", "--warmup", "warm-up requests, e.g. 16 (0: none)"),
            ("seed", "--seed", "a whole number, e.g. 0"),
            ("prefix_count", "--prefix-count", "distinct shared prefixes, e.g. 4"),
            ("prefix_len", "--prefix-len", "tokens per shared prefix, e.g. 512"),
        ):
            _whole(getattr(self, name), flag, hint)
        if self.seed < 0:
            # random.Random(-3) draws what random.Random(3) draws: a negative
            # seed would meet a later phase's prompts (qtune.seeds)
            raise InputError(f"--seed: {self.seed} is negative", hint="a whole number, e.g. 0")
        for name, flag in (("arrival", "--arrival"), ("endpoint", "--endpoint")):
            if not isinstance(getattr(self, name), str):
                raise InputError(f"{flag}: {getattr(self, name)!r} is not a name",
                                 hint="poisson or constant" if name == "arrival"
                                 else "completions or chat")
        if self.dataset is not None and not isinstance(self.dataset, str):
            raise InputError(f"--dataset: {self.dataset!r} is not a path",
                             hint="a ShareGPT JSON or JSONL file")
        if self.rate is not None:
            r = _number(self.rate, "--rate", "requests per second, e.g. 4 or 0.5")
            if not MIN_RATE <= r <= MAX_RATE:
                raise InputError(
                    f"--rate {r:g} is outside {MIN_RATE:g}..{MAX_RATE:g} req/s",
                    hint="requests per second, e.g. 4; for a closed loop use "
                    "--concurrency")
        if self.duration is not None:
            d = _number(self.duration, "--duration", "seconds, e.g. 60")
            if d <= 0:
                raise InputError("--duration must be positive", hint="seconds, e.g. 60")
        b = _number(self.burstiness, "--burstiness",
                    "1 = Poisson, < 1 burstier, > 1 more regular")
        if not MIN_BURSTINESS <= b <= MAX_BURSTINESS:
            raise InputError(
                f"--burstiness {b:g} is outside {MIN_BURSTINESS:g}..{MAX_BURSTINESS:g}",
                hint="1 = Poisson, < 1 burstier, > 1 more regular")
        for name, flag in (("request_timeout", "--request-timeout"),
                           ("stall_timeout", "--stall-timeout")):
            if _number(getattr(self, name), flag, "seconds, e.g. 600") <= 0:
                raise InputError(f"{flag} must be positive", hint="seconds, e.g. 600")
        lens = (Lengths.parse(self.input_len, "--input-len"),
                Lengths.parse(self.output_len, "--output-len"))
        object.__setattr__(self, "_lengths", lens)
        if self.rate is not None and self.concurrency is not None:
            raise InputError(
                "--rate and --concurrency are exclusive",
                hint="--rate R sends requests at R/s (Poisson by default); "
                "--concurrency C keeps C requests in flight",
            )
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError("--concurrency must be at least 1", hint="streams in flight")
        if self.rate is None and self.concurrency is None:
            object.__setattr__(self, "concurrency", DEFAULT_CONCURRENCY)
        if self.requests is None and self.duration is None:
            object.__setattr__(self, "requests", DEFAULT_REQUESTS)
        if self.requests is not None and self.requests < 1:
            raise InputError("--requests must be at least 1", hint="measured requests")
        if self.warmup_requests < 0:
            raise InputError("--warmup must be 0 or more", hint="0 disables the warm-up")
        if self.arrival not in ARRIVALS:
            raise InputError(f"--arrival: unknown {self.arrival!r}",
                             hint="poisson (with --burstiness) or constant")
        if self.endpoint not in ENDPOINTS:
            raise InputError(f"--endpoint: unknown {self.endpoint!r}",
                             hint="completions or chat")
        if self.prefix_count < 0 or self.prefix_len < 0 or (
            bool(self.prefix_count) != bool(self.prefix_len)
        ):
            raise InputError("--prefix-count and --prefix-len go together",
                             hint="e.g. --prefix-count 4 --prefix-len 512")
        if self.dataset is not None:
            if not dataset_file(self.dataset).is_file():
                raise InputError(f"--dataset: {self.dataset} is not a file",
                                 hint="ShareGPT JSON or JSONL with 'prompt' lines, or "
                                 + " or ".join(BUILTIN_DATASETS))
            # Read (once, cached) now: a bad file must be refused before any
            # server starts, not when the first trial builds its requests.
            load_dataset(dataset_file(self.dataset))

    @property
    def arrivals_seed(self) -> int:
        """The seed of the measured phase's send times."""
        return self.seed if self._arrival_seed is None else self._arrival_seed

    @property
    def input_lengths(self) -> Lengths:
        return self._lengths[0]

    @property
    def output_lengths(self) -> Lengths:
        return self._lengths[1]

    @property
    def max_total_len(self) -> int:
        """Longest prompt + output this workload can send (synthetic only)."""
        return self.prefix_len + self.input_lengths.max + self.output_lengths.max

    @property
    def mode(self) -> str:
        if self.rate is not None:
            if self.arrival == "constant":
                return f"constant {self.rate:g} req/s"
            burst = f", burstiness {self.burstiness:g}" if self.burstiness != 1 else ""
            return f"poisson {self.rate:g} req/s{burst}"
        return f"concurrency {self.concurrency or 1}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("_lengths")
        d.pop("_arrival_seed")
        # Timeouts at their defaults are left out, so that a study begun
        # before they existed still resumes (it compares workload dicts).
        for name, default in (("request_timeout", DEFAULT_REQUEST_TIMEOUT),
                              ("stall_timeout", DEFAULT_STALL_TIMEOUT)):
            if d[name] == default:
                d.pop(name)
        return d

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if not f.name.startswith("_")]


def load_workload_file(path: Path) -> dict[str, Any]:
    """A YAML mapping with Workload's keys (input_len, rate, dataset, ...)."""
    import difflib

    data = read_mapping(path, "--workload",
                        "a mapping like 'rate: 4' / 'input_len: 128-512'; keys: "
                        + ", ".join(Workload.keys()))
    for k in data:
        if k not in Workload.keys():
            close = difflib.get_close_matches(str(k), Workload.keys(), n=2)
            raise InputError(
                f"--workload {path}: unknown key {k!r}",
                hint=("did you mean " + " or ".join(close) + "? " if close else "")
                + "keys: " + ", ".join(Workload.keys()),
            )
    if data.get("dataset"):
        ds = Path(data["dataset"])
        if not ds.is_absolute() and data["dataset"] not in BUILTIN_DATASETS:
            data["dataset"] = str((path.parent / ds).resolve())
    return data
