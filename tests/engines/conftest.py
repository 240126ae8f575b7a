from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import FIX
from tests.fakes.nvml import ReplayNVML

# captured engine material (README.md there says where each file came from)
ENG_FIX = Path(__file__).parent / "fixtures"
H200X2 = FIX / "hosts" / "h200x2"


def replay_nvml(host: Path) -> ReplayNVML:
    return ReplayNVML(json.loads((host / "nvml.json").read_text()))
