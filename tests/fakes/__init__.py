"""The suite's stand-ins, in one place: tests import them from here, never
from one another.

- ``server``: a process that only answers readiness (qtune.server's tests);
  ``python -m tests.fakes.server``.
- ``llm_server``: a streaming OpenAI server process, the fake engine's
  (``python -m tests.fakes.llm_server``); ``engine``: ``FakeEngine``, the
  adapter that launches it.
- ``sse``: in-process SSE servers written byte by byte (``serve``,
  ``Threaded``, ``CountingServer``); ``queue``: ``queue_server``, one engine
  with a queue on top of them.
- ``nvml``: pynvml stand-ins (``NoNVML``, ``ReplayNVML`` of a recorded host).
- ``model``: ``make_model``, a model folder with only a config.json;
  ``profile``: ``sample_profile``.
"""
