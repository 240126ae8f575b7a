"""What load to send: prompt/output lengths, arrivals, bounds, warm-up."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qtune.errors import InputError


@dataclass(frozen=True)
class Workload:
    input_len: int = 256
    output_len: int = 64
    rate: float | None = None  # requests/s, Poisson arrivals
    concurrency: int | None = None  # fixed number of streams
    requests: int | None = 100
    duration: float | None = None  # seconds; whichever bound comes first
    warmup_requests: int = 8
    seed: int = 0
    endpoint: str = "completions"

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise InputError(
                "--input-len and --output-len must be at least 1",
                hint="lengths are in tokens",
            )
        if self.rate is not None and self.concurrency is not None:
            raise InputError(
                "--rate and --concurrency are exclusive",
                hint="--rate R sends Poisson arrivals; --concurrency C keeps C "
                "requests in flight",
            )
        if self.rate is not None and self.rate <= 0:
            raise InputError("--rate must be positive", hint="requests per second")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError("--concurrency must be at least 1")
        if self.requests is None and self.duration is None:
            raise InputError(
                "the load needs a bound", hint="give --requests N or --duration S"
            )
        if self.requests is not None and self.requests < 1:
            raise InputError("--requests must be at least 1")
        if self.duration is not None and self.duration <= 0:
            raise InputError("--duration must be positive", hint="seconds")
        if self.warmup_requests < 0:
            raise InputError("--warmup must be 0 or more")

    @property
    def mode(self) -> str:
        if self.rate is not None:
            return f"poisson {self.rate:g} req/s"
        return f"concurrency {self.concurrency or 1}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
