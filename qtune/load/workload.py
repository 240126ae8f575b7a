"""What load to send: request shapes (lengths, dataset, shared prefixes),
arrivals (Poisson with burstiness, constant rate, fixed concurrency), bounds
and warm-up.  Shared by ``qtune bench`` and ``qtune search``; a workload can
come from flags or from a ``--workload FILE.yaml`` with the same keys.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from qtune.errors import InputError
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
            if re.fullmatch(r"\d+", text):
                n = int(text)
                if n >= 1:
                    return cls("fixed", n)
            elif m := re.fullmatch(r"(\d+)\s*[-:]\s*(\d+)", text):
                lo, hi = int(m[1]), int(m[2])
                if 1 <= lo <= hi:
                    return cls("uniform", lo, hi)
            elif m := re.fullmatch(r"normal:(\d+):(\d+)", text):
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


@dataclass(frozen=True)
class Workload:
    input_len: int | str = 256
    output_len: int | str = 64
    rate: float | None = None  # requests/s
    concurrency: int | None = None  # fixed number of streams
    requests: int | None = 100
    duration: float | None = None  # seconds; whichever bound comes first
    warmup_requests: int = 8
    seed: int = 0
    endpoint: str = "completions"
    arrival: str = "poisson"  # with --rate: poisson | constant
    burstiness: float = 1.0  # gamma shape of inter-arrivals (1 = Poisson)
    dataset: str | None = None  # ShareGPT JSON or JSONL {prompt, output_tokens}
    prefix_count: int = 0  # shared-prefix workload: N distinct system prompts
    prefix_len: int = 0  # ... of this many tokens each
    _lengths: tuple[Lengths, Lengths] = field(
        default=(Lengths("fixed", 1), Lengths("fixed", 1)), repr=False, compare=False
    )

    def __post_init__(self) -> None:
        lens = (Lengths.parse(self.input_len, "--input-len"),
                Lengths.parse(self.output_len, "--output-len"))
        object.__setattr__(self, "_lengths", lens)
        if self.rate is not None and self.concurrency is not None:
            raise InputError(
                "--rate and --concurrency are exclusive",
                hint="--rate R sends requests at R/s (Poisson by default); "
                "--concurrency C keeps C requests in flight",
            )
        if self.rate is not None and self.rate <= 0:
            raise InputError("--rate must be positive", hint="requests per second")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError("--concurrency must be at least 1", hint="streams in flight")
        if self.requests is None and self.duration is None:
            raise InputError(
                "the load needs a bound", hint="give --requests N or --duration S"
            )
        if self.requests is not None and self.requests < 1:
            raise InputError("--requests must be at least 1", hint="measured requests")
        if self.duration is not None and self.duration <= 0:
            raise InputError("--duration must be positive", hint="seconds")
        if self.warmup_requests < 0:
            raise InputError("--warmup must be 0 or more", hint="0 disables the warm-up")
        if self.arrival not in ("poisson", "constant"):
            raise InputError(f"--arrival: unknown {self.arrival!r}",
                             hint="poisson (with --burstiness) or constant")
        if self.burstiness <= 0:
            raise InputError("--burstiness must be positive",
                             hint="1 = Poisson, < 1 burstier, > 1 more regular")
        if self.endpoint not in ("completions", "chat"):
            raise InputError(f"--endpoint: unknown {self.endpoint!r}",
                             hint="completions or chat")
        if self.prefix_count < 0 or self.prefix_len < 0 or (
            bool(self.prefix_count) != bool(self.prefix_len)
        ):
            raise InputError("--prefix-count and --prefix-len go together",
                             hint="e.g. --prefix-count 4 --prefix-len 512")
        if self.dataset is not None and not Path(self.dataset).is_file():
            raise InputError(f"--dataset: {self.dataset} is not a file",
                             hint="ShareGPT JSON or JSONL with 'prompt' lines")

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
        if not ds.is_absolute():
            data["dataset"] = str((path.parent / ds).resolve())
    return data


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_tokens: int
    max_tokens: int


class PromptFactory:
    """Synthetic prompts of an exact token length.

    With a tokenizer: random ids decoded to text, re-encoded and trimmed
    until the text is exactly ``n`` tokens (vLLM's random dataset does the
    same).  Without one: ``n`` common words, about one token each.
    """

    def __init__(self, tokenizer_path: Path | None, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tok = None
        if tokenizer_path is not None and (tokenizer_path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(str(tokenizer_path / "tokenizer.json"))
            # Skip special tokens: they may end or reshape the prompt.
            specials = {
                i for t, i in self.tok.get_vocab(with_added_tokens=True).items()
                if t.startswith("<") and t.endswith(">")
            }
            n = self.tok.get_vocab_size(with_added_tokens=True)
            self.ids = [i for i in range(n) if i not in specials]

    def count(self, text: str) -> int | None:
        if self.tok is None:
            return None
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def prompt(self, n: int) -> tuple[str, int]:
        """A prompt and its length in tokens (exact with a tokenizer)."""
        if self.tok is None:
            words = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as"]
            return " ".join(self.rng.choice(words) for _ in range(n)), n
        ids = [self.rng.choice(self.ids) for _ in range(n)]
        text = self.tok.decode(ids)
        for _ in range(8):
            enc = self.tok.encode(text, add_special_tokens=False).ids
            if len(enc) == n:
                return text, n
            if len(enc) > n:
                enc = enc[:n]
            else:
                enc = enc + [self.rng.choice(self.ids) for _ in range(n - len(enc))]
            text = self.tok.decode(enc)
        return text, len(self.tok.encode(text, add_special_tokens=False).ids)


class RequestSource:
    """Yields the requests of one phase, reproducibly from the seed."""

    def __init__(self, wl: Workload, tokenizer: Path | None, seed: int) -> None:
        self.wl = wl
        self.rng = random.Random(seed)
        self.prompts = PromptFactory(tokenizer, seed)
        self.prefixes = [
            self.prompts.prompt(wl.prefix_len) for _ in range(wl.prefix_count)
        ]
        self.dataset = _load_dataset(Path(wl.dataset)) if wl.dataset else None
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
            n = self.prompts.count(prompt) or len(prompt.split())
            return Request(prompt, n, out_tokens or wl.output_lengths.sample(self.rng))
        text, n = self.prompts.prompt(wl.input_lengths.sample(self.rng))
        if self.prefixes:
            prefix, pn = self.prefixes[self.rng.randrange(len(self.prefixes))]
            text, n = prefix + " " + text, pn + n
            n = self.prompts.count(text) or n
        return Request(text, n, wl.output_lengths.sample(self.rng))

    def take(self, n: int) -> list[Request]:
        return [self.next() for _ in range(n)]


def _load_dataset(path: Path) -> list[tuple[str, int | None]]:
    """ShareGPT JSON (first human turn; the reply's length is the output
    length when no tokenizer is known: words) or JSONL with ``prompt`` and
    optional ``output_tokens``."""
    text = path.read_text()
    rows: list[tuple[str, int | None]] = []
    where = f"--dataset {path}"
    if path.suffix == ".jsonl" or not text.lstrip().startswith("["):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                prompt = obj["prompt"]
                out = obj.get("output_tokens")
                if not isinstance(prompt, str) or (out is not None and int(out) < 1):
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                raise InputError(f"{where} line {i}: not a JSON object with a "
                                 "'prompt' string",
                                 hint='each line: {"prompt": "...", "output_tokens": 128}'
                                 ) from None
            rows.append((prompt, int(out) if out is not None else None))
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{where}: not valid JSON ({exc})",
                         hint="ShareGPT JSON (a list of conversations) or JSONL") from None
        for conv in data:
            turns = conv.get("conversations") or conv.get("conversation") or []
            human = next((t.get("value") for t in turns
                          if t.get("from") in ("human", "user")), None)
            reply = next((t.get("value") for t in turns
                          if t.get("from") in ("gpt", "assistant")), None)
            if human and reply:
                # vLLM's ShareGPT loader drops very short samples too.
                out = max(len(reply.split()), 1)
                if len(human.split()) >= 4 and out >= 4:
                    rows.append((human, out))
    if not rows:
        raise InputError(f"{where}: no usable prompts",
                         hint="ShareGPT JSON or JSONL with a 'prompt' per line")
    return rows
