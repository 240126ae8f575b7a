"""vLLM CPU build: the host's binding, reserve and allocator dimensions in
the space, their checks and their launch, on the single-node capture and
the hand-written two-socket one (tests/fixtures/hosts/xeon-2s-32c-smt)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from qtune.engines.vllm import VLLM
from qtune.host import probe
from qtune.host.installed import EngineInstall, InstalledEngines
from qtune.load.workload import Workload
from qtune.search.config import TuneConfig
from qtune.search.inputs import prepare
from tests.conftest import FIX
from tests.fakes.model import make_model
from tests.fakes.nvml import NoNVML

XEON = FIX / "hosts" / "xeon-2s-32c-smt"


def _xeon_ctx(cpu_ctx, **host):
    facts = probe(root=XEON, nvml=NoNVML(), engine_python=sys.executable)
    return dataclasses.replace(cpu_ctx, host=dataclasses.replace(facts, **host))


def _space(ctx):
    return {p.name: p for p in VLLM().space(ctx)}


def test_few_cores_search_placement_only_when_asked(cpu_ctx):
    # The 2-vCPU capture: 0 reserved measured 15% slower there, so placement
    # and the reserve are searched only when a space file names them.
    assert len(cpu_ctx.host.cpu.cores or cpu_ctx.host.cpu.online) < 8
    space = _space(cpu_ctx)
    bind, reserve = space["VLLM_CPU_OMP_THREADS_BIND"], space["VLLM_CPU_NUM_OF_RESERVED_CPU"]
    assert (bind.choices, reserve.choices) == (("auto", "nobind"), (0, 1))
    assert bind.opt_in and reserve.opt_in and "only when --space names it" in bind.help
    # one node: no tensor parallel, and no allocator library in the capture
    assert "tensor_parallel_size" not in space and "LD_PRELOAD" not in space


def test_single_node_of_many_cores_offers_auto_nobind_and_the_reserve(cpu_ctx):
    cpus = list(range(16))
    node = dataclasses.replace(cpu_ctx.host.numa[0], cpus=cpus)
    cpu = dataclasses.replace(cpu_ctx.host.cpu, online=cpus, cores=[[c] for c in cpus])
    ctx = dataclasses.replace(cpu_ctx, host=dataclasses.replace(
        cpu_ctx.host, numa=[node], cpu=cpu, usable_cpus=cpus))
    space = _space(ctx)
    bind = space["VLLM_CPU_OMP_THREADS_BIND"]
    assert (bind.choices, bind.target) == (("auto", "nobind"), "env")
    assert "auto: vLLM's default" in bind.help and "nobind: " in bind.help
    assert space["VLLM_CPU_NUM_OF_RESERVED_CPU"].choices[:2] == (0, 1)
    assert not bind.opt_in and not space["VLLM_CPU_NUM_OF_RESERVED_CPU"].opt_in
    assert "tensor_parallel_size" not in space


def test_two_socket_space(cpu_ctx):
    ctx = _xeon_ctx(cpu_ctx, allocators={"tcmalloc": "/usr/lib64/libtcmalloc.so.4"})
    space = _space(ctx)
    assert space["tensor_parallel_size"].choices == (1, 2)
    assert space["VLLM_CPU_OMP_THREADS_BIND"].choices == (
        "auto", "nobind", "0-31,64-95", "0-31,64-95|32-63,96-127")
    assert space["VLLM_CPU_NUM_OF_RESERVED_CPU"].choices == (0, 1, 2, 4)
    assert space["LD_PRELOAD"].choices == ("glibc", "/usr/lib64/libtcmalloc.so.4")


def test_jemalloc_only_without_a_bundled_tcmalloc(cpu_ctx, tmp_path):
    allocs = {"jemalloc": "/usr/lib/libjemalloc.so.2"}
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    ctx = _xeon_ctx(cpu_ctx, allocators=allocs)
    ctx = dataclasses.replace(ctx, install=dataclasses.replace(
        ctx.install, location=str(pkg / "__init__.py")))
    assert _space(ctx)["LD_PRELOAD"].choices == ("glibc", "/usr/lib/libjemalloc.so.2")
    (pkg / "libs").mkdir()
    (pkg / "libs" / "libtcmalloc_minimal-1a2b.so.4").write_bytes(b"")
    assert "LD_PRELOAD" not in _space(ctx)


def test_check_matches_binding_to_ranks(cpu_ctx):
    ctx = _xeon_ctx(cpu_ctx)
    v = VLLM()
    two = "0-31,64-95|32-63,96-127"
    assert v.check({"tensor_parallel_size": 2, "VLLM_CPU_OMP_THREADS_BIND": two}, ctx) == []
    assert v.check({"tensor_parallel_size": 2, "VLLM_CPU_OMP_THREADS_BIND": "auto",
                    "VLLM_CPU_NUM_OF_RESERVED_CPU": 4}, ctx) == []
    assert any("2 CPU lists for 1 ranks" in m for m in
               v.check({"VLLM_CPU_OMP_THREADS_BIND": two}, ctx))
    assert any("only to auto" in m for m in
               v.check({"VLLM_CPU_OMP_THREADS_BIND": "nobind",
                        "VLLM_CPU_NUM_OF_RESERVED_CPU": 2}, ctx))
    assert v.check({"VLLM_CPU_OMP_THREADS_BIND": "nobind",
                    "VLLM_CPU_NUM_OF_RESERVED_CPU": 0}, ctx) == []
    assert any("cannot use" in m for m in
               v.check({"VLLM_CPU_OMP_THREADS_BIND": "0-200"}, ctx))
    # a CPU build has no GPUs to count
    assert not any("GPUs" in m for m in v.check({"tensor_parallel_size": 2}, ctx))


def test_check_on_one_node(cpu_ctx):
    v = VLLM()
    assert any("needs 2 NUMA nodes" in m for m in v.check(
        {"pipeline_parallel_size": 2}, cpu_ctx))
    assert any("leaves a rank no core" in m for m in v.check(
        {"VLLM_CPU_NUM_OF_RESERVED_CPU": 2}, cpu_ctx))
    assert v.check({"VLLM_CPU_NUM_OF_RESERVED_CPU": 1}, cpu_ctx) == []


def test_launch_env(cpu_ctx):
    ctx = _xeon_ctx(cpu_ctx, allocators={"tcmalloc": "/usr/lib64/libtcmalloc.so.4"})
    v = VLLM()
    spec = v.launch_spec({"VLLM_CPU_OMP_THREADS_BIND": "0-31,64-95",
                          "VLLM_CPU_NUM_OF_RESERVED_CPU": 0,
                          "LD_PRELOAD": "/usr/lib64/libtcmalloc.so.4"}, ctx,
                         host="h", port=1)
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-31,64-95"
    assert spec.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert spec.env["LD_PRELOAD"] == "/usr/lib64/libtcmalloc.so.4"
    assert not any("LD_PRELOAD" in a or "OMP" in a for a in spec.argv)
    glibc = v.launch_spec({"LD_PRELOAD": "glibc"}, ctx, host="h", port=1)
    assert "LD_PRELOAD" not in glibc.env


@pytest.mark.parametrize("named", [False, True])
def test_a_space_file_opts_in_to_placement_on_few_cores(named, cpu_ctx, tmp_path,
                                                         monkeypatch):
    import qtune.search.inputs as inputs

    install = EngineInstall("vllm", "0.32.0", "cpu", sys.executable, "/usr/bin/x")
    host = dataclasses.replace(cpu_ctx.host,
                               engines=InstalledEngines(sys.executable, [install]))
    monkeypatch.setattr(inputs, "probe", lambda **kw: host)
    monkeypatch.setattr(VLLM, "read_args", lambda self, install: None)
    space = tmp_path / "space.yaml"
    space.write_text("VLLM_CPU_OMP_THREADS_BIND: [auto, nobind]\n" if named
                     else "max_num_seqs: {low: 4, high: 16}\n")
    cfg = TuneConfig(model=str(make_model(tmp_path / "m")), trials=3, space_file=space,
                     workload=Workload(input_len=64, output_len=8, concurrency=2),
                     studies_dir=tmp_path / "studies", profiles_dir=tmp_path / "profiles")
    names = {p.name for p in prepare(cfg).params}
    assert ("VLLM_CPU_OMP_THREADS_BIND" in names) is named
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in names  # not named either way
    assert "max_num_seqs" in names
