"""What load to send: request shapes (lengths, dataset, shared prefixes),
arrivals (Poisson with burstiness, constant rate, fixed concurrency), bounds
and warm-up.  Shared by ``qtune bench`` and ``qtune search``; a workload can
come from flags or from a ``--workload FILE.yaml`` with the same keys.
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from qtune.errors import InputError, mask_url
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
            _load_dataset(dataset_file(self.dataset))

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


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_tokens: int  # the client's count (exact with a tokenizer, else words)
    max_tokens: int
    # The length asked for, to hold the server's count against; None for a
    # dataset prompt no tokenizer counted (no length was asked for).
    requested_tokens: int | None = None


# Candidate ids tried for a tokenizer's pool: a seeded sample, so a 150k
# vocabulary costs 5,000 single-token round trips (about 50 ms), not 150,000.
_POOL_CANDIDATES = 5000


def _clean_ids(tok: Any, vocab: int, specials: frozenset[int]) -> list[int]:
    """Ids that decode to text which encodes back to that one id.  A byte
    token of a byte-level BPE decodes to half a character, which re-encodes
    to other ids: prompts drawn from such ids missed their length by 2-3
    tokens in 40 after eight rounds of trimming."""
    ids = [i for i in range(vocab) if i not in specials]
    if len(ids) > _POOL_CANDIDATES:
        ids = sorted(random.Random(0).sample(ids, _POOL_CANDIDATES))
    clean = [i for i in ids
             if tok.encode(tok.decode([i]), add_special_tokens=False).ids == [i]]
    return clean or ids


class LocalTokenizer:
    """A ``tokenizer.json`` read with the ``tokenizers`` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        # Skip special tokens: they may end or reshape the prompt.
        specials = {
            i for t, i in self.tok.get_vocab(with_added_tokens=True).items()
            if t.startswith("<") and t.endswith(">")
        }
        n = self.tok.get_vocab_size(with_added_tokens=True)
        self.pool = _clean_ids(self.tok, n, frozenset(specials))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))


# Varied English for harvesting ordinary token ids from a server's tokenizer:
# about 150 distinct words, so random prompts share no 16-token block (vLLM's
# prefix-cache unit) by chance.
_HARVEST = (
    "The quick brown fox jumps over the lazy dog while seven wizards quietly "
    "judge boxing matches near a frozen river; meanwhile, bright yellow "
    "taxis carry tired musicians through narrow streets, past bakeries "
    "selling warm bread, chocolate cakes and spicy sausages. Engineers measure "
    "latency, throughput, memory bandwidth and queue depth before choosing "
    "hardware. History teaches patience: empires rise, harvests fail, "
    "oceans remain. Children laugh, elephants wander, volcanoes sleep, "
    "mountains glow at sunset. Doctors, farmers, pilots, teachers, lawyers "
    "and carpenters vote on Tuesday about taxes, bridges, libraries, "
    "hospitals, gardens and railways. Numbers like 42, 1987 and 3.14159 "
    "appear in reports, tables, spreadsheets and novels written in winter."
)


class ServerTokenizer:
    """The served model's own tokenizer, over vLLM's ``POST /tokenize``
    (``{"model", "prompt", "add_special_tokens"}`` → ``{"tokens", "count"}``)
    and ``POST /detokenize`` (``{"model", "tokens"}`` → ``{"prompt"}``).
    Synchronous: prompts are built before a phase starts, never during it."""

    def __init__(self, base_url: str, model: str, timeout: float = 30.0) -> None:
        self.base = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.calls = 0
        ids = set(self.encode(_HARVEST))
        if len(ids) < 64:
            # A vocabulary that knows no English (a word-level one maps it all
            # to <unk>): its low ids, round-tripped through text, are its words.
            # Not otherwise: in a byte-level BPE they are half characters.
            try:
                ids.update(self.encode(self.decode(list(range(256)))))
            except (OSError, ValueError, KeyError, TypeError):
                pass  # fewer than 256 ids, or no /detokenize: the harvest only
        self.pool = sorted(ids)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        from qtune.load.http import request_json

        self.calls += 1
        data = request_json(self.base + path, body, timeout=self.timeout)
        if not isinstance(data, dict):
            raise ValueError(f"{path} answered {type(data).__name__}, not an object")
        return data

    def encode(self, text: str) -> list[int]:
        data = self._post("/tokenize", {"model": self.model, "prompt": text,
                                        "add_special_tokens": False})
        tokens = data["tokens"]
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise ValueError("/tokenize: 'tokens' is not a list of ids")
        return tokens

    def decode(self, ids: list[int]) -> str:
        text = self._post("/detokenize", {"model": self.model, "tokens": ids})["prompt"]
        if not isinstance(text, str):
            raise ValueError("/detokenize: 'prompt' is not text")
        return text

    def __str__(self) -> str:
        return f"{mask_url(self.base)}/tokenize"

    @classmethod
    def connect(cls, base_url: str, model: str) -> tuple[ServerTokenizer | None, str]:
        """The server's tokenizer, or None and why not."""
        try:
            tok = cls(base_url, model)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"no usable /tokenize ({type(exc).__name__}: {exc})"[:200]
        if len(tok.pool) < 32:
            return None, f"/tokenize knows only {len(tok.pool)} distinct ids"
        return tok, f"the server's /tokenize ({base_url})"


class PromptFactory:
    """Synthetic prompts of an exact token length.

    With a tokenizer (a local ``tokenizer.json`` folder, or the server's own
    through ``ServerTokenizer``): random ids decoded to text, re-encoded and
    trimmed until the text is exactly ``n`` tokens (vLLM's random dataset
    does the same).  Without one: ``n`` common words, about one token each
    (measured: 3.4 tokens a word in a BPE vocabulary, so the server's counts
    are checked against these).
    """

    def __init__(self, tokenizer: Path | ServerTokenizer | LocalTokenizer | None,
                 seed: int) -> None:
        self.rng = random.Random(seed)
        self.tok: ServerTokenizer | LocalTokenizer | None = None
        if isinstance(tokenizer, (ServerTokenizer, LocalTokenizer)):
            self.tok = tokenizer
        elif tokenizer is not None and (tokenizer / "tokenizer.json").is_file():
            self.tok = LocalTokenizer(tokenizer)
        self.ids = self.tok.pool if self.tok is not None else []

    @property
    def exact(self) -> bool:
        return self.tok is not None

    def count(self, text: str) -> int | None:
        if self.tok is None:
            return None
        return len(self.tok.encode(text))

    def prompt(self, n: int) -> tuple[str, int]:
        """A prompt and its length in tokens (exact with a tokenizer)."""
        if self.tok is None:
            words = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as"]
            return " ".join(self.rng.choice(words) for _ in range(n)), n
        ids = [self.rng.choice(self.ids) for _ in range(n)]
        text = self.tok.decode(ids)
        for _ in range(8):
            enc = self.tok.encode(text)
            if len(enc) == n:
                return text, n
            if len(enc) > n:
                enc = enc[:n]
            else:
                enc = enc + [self.rng.choice(self.ids) for _ in range(n - len(enc))]
            text = self.tok.decode(enc)
        return text, len(self.tok.encode(text))


class RequestSource:
    """Yields the requests of one phase, reproducibly from the seed."""

    def __init__(self, wl: Workload,
                 tokenizer: Path | ServerTokenizer | LocalTokenizer | None,
                 seed: int) -> None:
        self.wl = wl
        self.rng = random.Random(seed)
        self.prompts = PromptFactory(tokenizer, seed)
        self.prefixes = [
            self.prompts.prompt(wl.prefix_len) for _ in range(wl.prefix_count)
        ]
        self.dataset = _load_dataset(dataset_file(wl.dataset)) if wl.dataset else None
        if self.dataset is not None:
            # A fixed-seed shuffle, then in order (cycling if the run needs
            # more requests than the file has).
            self.rng.shuffle(self.dataset)
        self.i = 0

    def next(self) -> Request:
        wl = self.wl
        if self.dataset is not None:
            prompt, out_tokens = self.dataset[self.i % len(self.dataset)]
            self.i += 1
            counted = self.prompts.count(prompt)
            return Request(prompt, counted or len(prompt.split()),
                           out_tokens or wl.output_lengths.sample(self.rng), counted)
        text, n = self.prompts.prompt(wl.input_lengths.sample(self.rng))
        if self.prefixes:
            prefix, pn = self.prefixes[self.rng.randrange(len(self.prefixes))]
            text, n = prefix + " " + text, pn + n
            n = self.prompts.count(text) or n
        return Request(text, n, wl.output_lengths.sample(self.rng), n)

    def take(self, n: int) -> list[Request]:
        return [self.next() for _ in range(n)]


# Prompt sets shipped with qtune, by the name --dataset takes (qtune/data/
# README.md: where each comes from, its licence).
BUILTIN_DATASETS = {
    # 64 instructions over prose paragraphs of CPython's documentation (PSF
    # licence), 64 output tokens each: real English, not token soup.
    "builtin:python-docs": "python-docs.jsonl",
}


def dataset_file(spec: str) -> Path:
    """The file of ``--dataset``: a shipped set by its name, else the path."""
    if spec in BUILTIN_DATASETS:
        return Path(__file__).parent.parent / "data" / BUILTIN_DATASETS[spec]
    return Path(spec)


def _load_dataset(path: Path) -> list[tuple[str, int | None]]:
    """ShareGPT JSON (first human turn; the reply's length is the output
    length when no tokenizer is known: words) or JSONL with ``prompt`` and
    optional ``output_tokens``.  A fresh list each call; the parse is cached
    per file version, since every ``dataclasses.replace`` of a workload
    re-checks its dataset (a ShareGPT file is 600+ MB)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(f"--dataset {path}: cannot read ({exc.strerror})",
                         hint="ShareGPT JSON or JSONL with 'prompt' lines") from None
    return list(_parse_dataset(str(path.resolve()), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=4)
def _parse_dataset(
    name: str, _mtime_ns: int, _size: int
) -> tuple[tuple[str, int | None], ...]:
    path = Path(name)
    where = f"--dataset {path}"
    from qtune.files import note_input

    note_input(path)  # no output of this command (--csv) may replace it
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not UTF-8 text (byte {exc.start} is "
                         f"0x{exc.object[exc.start]:02x})",
                         hint="ShareGPT JSON or JSONL, saved as UTF-8") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot read ({exc.strerror})",
                         hint="ShareGPT JSON or JSONL with 'prompt' lines") from None
    from qtune.untrusted import loads

    rows: list[tuple[str, int | None]] = []
    if path.suffix == ".jsonl" or not text.lstrip().startswith("["):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = loads(line, f"{where} line {i}")
                prompt = obj["prompt"]
                out = obj.get("output_tokens")
                if not isinstance(prompt, str) or (
                    out is not None and (isinstance(out, bool)
                                         or not isinstance(out, int) or out < 1)
                ):
                    raise ValueError
            except (ValueError, KeyError, TypeError, AttributeError):
                raise InputError(f"{where} line {i}: not a JSON object with a "
                                 "'prompt' string",
                                 hint='each line: {"prompt": "...", "output_tokens": 128}'
                                 ) from None
            rows.append((prompt, out))
    else:
        try:
            data = loads(text, where, max_bytes=1 << 30)
        except ValueError as exc:
            raise InputError(f"{where}: not valid JSON ({exc})",
                         hint="ShareGPT JSON (a list of conversations) or JSONL") from None
        shape_hint = ('ShareGPT: [{"conversations": [{"from": "human", "value": '
                      '"..."}, {"from": "gpt", "value": "..."}]}, ...]')
        for k, conv in enumerate(data):
            turns = (conv.get("conversations") or conv.get("conversation") or []
                     if isinstance(conv, dict) else None)
            if not isinstance(turns, list) or not all(
                isinstance(t, dict) for t in turns
            ):
                raise InputError(f"{where} item {k}: not a conversation object",
                                 hint=shape_hint)
            human = next((t.get("value") for t in turns
                          if t.get("from") in ("human", "user")), None)
            reply = next((t.get("value") for t in turns
                          if t.get("from") in ("gpt", "assistant")), None)
            if isinstance(human, str) and isinstance(reply, str) and human and reply:
                # vLLM's ShareGPT loader drops very short samples too.
                out = max(len(reply.split()), 1)
                if len(human.split()) >= 4 and out >= 4:
                    rows.append((human, out))
    if not rows:
        raise InputError(f"{where}: no usable prompts",
                         hint="ShareGPT JSON or JSONL with a 'prompt' per line")
    return tuple(rows)
