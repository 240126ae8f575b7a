"""The prompt sets ``--dataset`` names: the shipped ones by name, ShareGPT
JSON and JSONL files read as untrusted input (each parse cached per file
version)."""

from __future__ import annotations

import functools
from pathlib import Path

from qtune.errors import InputError

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


def load_dataset(path: Path) -> list[tuple[str, int | None]]:
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
