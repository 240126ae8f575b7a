"""The requests a load sends: prompts of exact token lengths drawn from a
tokenizer's clean ids (local ``tokenizer.json`` or the server's
``/tokenize``), or a dataset's prompts, seeded per measured phase."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qtune.errors import mask_url
from qtune.load.datasets import dataset_file, load_dataset
from qtune.load.workload import Workload


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
        self.dataset = load_dataset(dataset_file(wl.dataset)) if wl.dataset else None
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
