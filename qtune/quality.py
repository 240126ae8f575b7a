"""The quality gate: what a configuration does to the model's answers,
measured on the trial's own server against the engine defaults' (the
study's baseline, on the same server type).

Two figures from shipped text (``qtune/data/quality.json``: prose of
CPython's documentation, PSF licence; see ``qtune/data/README.md``):

- the perplexity of the evaluation passages (about 3,000 tokens), read as
  each token's log-probability through the server's API; the *quality
  loss* is the relative rise over the reference's (0.02 = +2%), and with
  the same tokenizer the mean per-token log-probability difference says how
  closely the two agree;
- exact match of greedy outputs: 16 prompts x 32 tokens at temperature 0,
  each output the same as the reference's or not.

A trial whose loss exceeds ``--max-quality-loss`` is infeasible, like an SLO
breach.  With random weights (``--load-format dummy``) the figures would
describe noise: the trial says "not measured" instead.

The passages go one at a time, so every config scores them as a batch of one
(a batched row need not be summed in the same order) and the gated figure
measures the config, not its batching.  The greedy prompts go together: one
at a time they took 35 s of a 59 s sample on 2 cores (vLLM CPU, 15 tokens/s
for one stream); a batch of 16 may differ from a batch of one in its last
bits, which exact match would show, so it is reported, not gated.
"""

from __future__ import annotations

import functools
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qtune.engines.base import Engine

DATA = Path(__file__).parent / "data" / "quality.json"
GREEDY_TOKENS = 32
# Stored per-token figures are rounded: 4 decimals is 1e-4 nats, far below
# any loss worth gating, and keeps a reference sample near 20 KB.
_DECIMALS = 4


@dataclass(frozen=True)
class EvalSet:
    source: str
    licence: str
    passages: tuple[str, ...]
    greedy_prompts: tuple[str, ...]


@functools.cache
def eval_set(path: Path = DATA) -> EvalSet:
    """The shipped evaluation text and greedy prompts."""
    d = json.loads(path.read_text(encoding="utf-8"))
    return EvalSet(d["source"], d["licence"], tuple(d["eval_passages"]),
                   tuple(d["greedy_prompts"]))


@dataclass
class Sample:
    """What one server answered: per passage, its tokens' log-probabilities
    (the first token's excepted); the greedy outputs in prompt order."""

    logprobs: list[list[float]]
    greedy: list[str]
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"logprobs": [[round(v, _DECIMALS) for v in p] for p in self.logprobs],
                "greedy": list(self.greedy), "seconds": round(self.seconds, 3)}

    @classmethod
    def from_dict(cls, d: Any) -> Sample | None:
        """A stored sample, or None when it is not one (an older study, a
        damaged attribute)."""
        try:
            lps = [[float(v) for v in p] for p in d["logprobs"]]
            greedy = [str(g) for g in d["greedy"]]
        except (KeyError, TypeError, ValueError):
            return None
        return cls(lps, greedy, float(d.get("seconds") or 0.0))


def take_sample(engine: Engine, base_url: str, model: str, *,
                timeout: float = 120.0) -> Sample:
    """Score the evaluation passages and generate the greedy outputs on the
    server at ``base_url``.  Raises ValueError (an answer without the
    figures) or OSError (the request failed)."""
    from qtune.load.http import request_json

    es = eval_set()
    base = base_url.rstrip("/")
    t0 = time.monotonic()
    lps = []
    for text in es.passages:
        req = engine.logprobs_request(model, text)
        if req is None:
            raise ValueError(f"{engine.name} answers no log-probabilities")
        lps.append(engine.read_logprobs(request_json(base + req[0], req[1],
                                                     timeout=timeout)))

    def generate(prompt: str) -> str:
        path, body = engine.greedy_request(model, prompt, GREEDY_TOKENS)
        return engine.read_text(request_json(base + path, body, timeout=timeout))

    with ThreadPoolExecutor(len(es.greedy_prompts)) as pool:
        greedy = list(pool.map(generate, es.greedy_prompts))
    return Sample(lps, greedy, time.monotonic() - t0)


def perplexity(logprobs: list[list[float]]) -> float:
    """exp of the mean negative log-probability over every scored token."""
    flat = [v for p in logprobs for v in p]
    if not flat:
        raise ValueError("no token scored")
    return math.exp(-math.fsum(flat) / len(flat))


@dataclass
class Quality:
    """A trial's quality figure against the reference (the ``quality``
    attribute of a trial, the profile's ``metrics.quality``)."""

    measured: bool
    note: str | None = None  # why not measured, or "reference"
    loss: float | None = None  # perplexity / reference's - 1
    perplexity: float | None = None
    reference_perplexity: float | None = None
    # Mean |log p - reference log p| per token: None when the two servers
    # did not score the same number of tokens (another tokenizer).
    logprob_diff: float | None = None
    tokens: int | None = None
    exact_match: int | None = None  # greedy outputs equal to the reference's
    prompts: int | None = None
    numerics: dict[str, Any] = field(default_factory=dict)  # params that change them
    seconds: float | None = None  # how long the sample took

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != {}}

    @classmethod
    def from_dict(cls, d: Any) -> Quality | None:
        if not isinstance(d, dict) or not isinstance(d.get("measured"), bool):
            return None
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        try:
            return cls(**known)
        except TypeError:
            return None

    def text(self) -> str:
        """One line for the trials table, the console and the report."""
        if not self.measured:
            return f"not measured: {self.note}"
        if self.note == "reference":
            return f"reference: perplexity {self.perplexity:.3f}"
        assert self.loss is not None
        return (f"perplexity {self.loss * 100:+.2f}% ({self.perplexity:.3f} vs "
                f"{self.reference_perplexity:.3f}), greedy {self.exact_match}/"
                f"{self.prompts} identical")


def not_measured(why: str, numerics: dict[str, Any] | None = None) -> Quality:
    return Quality(False, note=why, numerics=dict(numerics or {}))


def compare(ref: Sample, cand: Sample, numerics: dict[str, Any] | None = None,
            *, reference: bool = False) -> Quality:
    """The candidate's figures against the reference's."""
    p_ref, p = perplexity(ref.logprobs), perplexity(cand.logprobs)
    shapes = [len(x) for x in ref.logprobs] == [len(x) for x in cand.logprobs]
    diff = None
    tokens = sum(len(x) for x in cand.logprobs)
    if shapes:
        diff = math.fsum(abs(a - b) for ra, rb in zip(ref.logprobs, cand.logprobs,
                                                      strict=True)
                         for a, b in zip(ra, rb, strict=True)) / tokens
    same = sum(a == b for a, b in zip(ref.greedy, cand.greedy, strict=False))
    return Quality(True, note="reference" if reference else None, loss=p / p_ref - 1,
                   perplexity=p, reference_perplexity=p_ref, logprob_diff=diff,
                   tokens=tokens, exact_match=same, prompts=len(cand.greedy),
                   numerics=dict(numerics or {}), seconds=round(cand.seconds, 3))


def violation(q: Quality | None, max_loss: float) -> float:
    """The quality constraint (feasible when <= 0, Optuna's convention): the
    loss beyond ``max_loss``; a config that changes numerics but whose
    quality could not be measured on real weights is not let through
    (1.0); anything else not measured is no violation."""
    if q is None:
        return 0.0
    if q.measured:
        assert q.loss is not None
        return q.loss - max_loss
    if q.numerics and not (q.note or "").startswith("random weights"):
        return 1.0
    return 0.0


def reason(q: Quality, max_loss: float) -> str:
    """Why a trial is infeasible on quality, for its ``detail``."""
    if q.measured:
        return (f"quality: {q.text()}; over --max-quality-loss "
                f"{max_loss * 100:g}%")
    return (f"quality: {q.text()}, and it changes numerics "
            + ", ".join(f"{k}={v}" for k, v in q.numerics.items()))
