"""gorun.torch's plan from the module, in process (no ranks): regions,
members (tied parameters once, read by every region that reads them), the
step graph and its planning; device tensors refused."""

import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

import gorun.torch as gt  # noqa: E402
from gorun._lib import GorunError  # noqa: E402
from gorun.torch import _plan  # noqa: E402

from conftest import ROOT  # noqa: E402
from step_prog import GPT, ResMLP  # noqa: E402


def test_regions_are_blocks_and_top_level_modules():
    names = [r for r, _ in _plan.find_regions(GPT(blocks=4))]
    assert names == ["<root>", "tok", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln", "head"]
    names = [r for r, _ in _plan.find_regions(ResMLP(blocks=3))]
    assert names == ["inp", "layers.0", "layers.1", "layers.2", "unused", "side", "outp"]


def test_a_block_list_below_a_module_is_opened_and_blocks_stay_whole():
    nn = torch.nn

    class Attn(nn.Module):  # a block holding its own Sequential
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(4, 12)
            self.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))

    class GPT2(nn.Module):  # transformer.h, GPT-2's layout
        def __init__(self):
            super().__init__()
            self.transformer = nn.Module()
            self.transformer.wte = nn.Embedding(8, 4)
            self.transformer.h = nn.ModuleList([Attn(), Attn()])
            self.lm_head = nn.Linear(4, 8)

    names = [r for r, _ in _plan.find_regions(GPT2())]
    assert names == ["transformer.wte", "transformer.h.0", "transformer.h.1", "lm_head"]


def test_tied_parameter_is_one_member_read_by_both_regions():
    model = GPT(blocks=4)
    regions = [r for r, _ in _plan.find_regions(model)]
    members = _plan.find_members(model, regions)
    tied = [m for m in members if m.param is model.tok.weight]
    assert len(tied) == 1, [m.name for m in tied]
    assert tied[0].name == "tok.weight" and tied[0].readers == ["tok", "head"]
    # Every trainable tensor once, nothing frozen.
    assert len(members) == len(list(model.parameters()))
    mlp = ResMLP()
    names = {m.name for m in _plan.find_members(mlp, [r for r, _ in _plan.find_regions(mlp)])}
    assert "inp.weight" not in names and "unused.weight" in names


def test_graph_reduces_the_tied_gradient_after_its_first_reader(tmp_path):
    model = GPT(blocks=4)
    regions = [r for r, _ in _plan.find_regions(model)]
    members = _plan.find_members(model, regions)
    g = _plan.ddp_graph(regions, members, {r: 10000 for r in regions}, {r: 20000 for r in regions}, 2)
    starts = {n["name"]: n for n in g["nodes"] if n["kind"] == "start"}
    assert starts["ar/tok.weight"]["region"] == "tok"  # complete only after tok's backward
    names = [n["name"] for n in g["nodes"]]
    assert names.index("bwd/head") < names.index("bwd/tok") < names.index("ar/tok.weight")
    planned, summary = _plan.run_planner(g)
    assert json.loads(planned)["schema"] == "gorun.stepgraph/v1"
    # What gorun plan prints from the dumped plan is the same plan.
    path = tmp_path / "plan.json"
    path.write_text(planned)
    out = subprocess.run([os.environ.get("GORUN_BIN", os.path.join(ROOT, "bin", "gorun")), "plan", "--json",
                          "--passes", "", str(path)], stdout=subprocess.PIPE, check=True).stdout
    again = json.loads(out)
    assert [b["members"] for b in again["buckets"]] == [b["members"] for b in summary["buckets"]]
    got = sorted(m for b in summary["buckets"] for m in b["members"])
    assert got == sorted("g/" + m.name for m in members)
    assert len(summary["buckets"]) < len(members)  # the passes merged something


def test_fingerprint_sees_ties_and_shapes():
    a, b = GPT(), GPT()
    assert _plan.fingerprint(a) == _plan.fingerprint(b)
    b.head.weight = torch.nn.Parameter(b.tok.weight.detach().clone())  # untied
    assert _plan.fingerprint(a) != _plan.fingerprint(b)
    assert _plan.fingerprint(GPT(d=32)) != _plan.fingerprint(GPT(d=64))


def test_device_tensors_are_refused_clearly():
    model = GPT().to("meta")
    with pytest.raises(RuntimeError, match=r"'pos' is on meta; gorun.torch runs host \(CPU\) tensors only"):
        gt.distribute(model)


def test_a_cuda_model_is_refused_without_a_gpu():
    # A CUDA model on a machine without one: FakeTensorMode makes
    # parameters whose device is cuda:0 with no driver behind them.
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        model = torch.nn.Linear(4, 4, device="cuda")
    assert model.weight.device.type == "cuda"
    with pytest.raises(RuntimeError, match=r"'weight' is on cuda:0; gorun.torch runs host \(CPU\) tensors only"):
        gt.distribute(model, mode="fsdp")


def _one_step(m, opt):
    x = torch.randint(0, 64, (2, 16))
    m(x, torch.roll(x, -1, 1)).backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_distributed_model_is_not_moved_or_cast(mode):
    # After distribute(), the buckets, shards and bucket-viewed gradients
    # hold the CPU tensors: .to(device) / .cuda() / a cast is refused
    # before anything changes; a move or cast to what the tensors already
    # are goes through, and training goes on.
    from torch._subclasses.fake_tensor import FakeTensorMode
    torch.manual_seed(0)
    m = gt.distribute(GPT(d=64), mode=mode)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(2):
        _one_step(m, opt)
    before = [(n, p.device, p.dtype, p.data_ptr()) for n, p in m.named_parameters()]
    with pytest.raises(RuntimeError,
                       match=r"would become float32 on meta: a distributed model's tensors cannot be moved"):
        m.to("meta")
    with pytest.raises(RuntimeError, match=r"\(float32 on cpu\) would become float64 on cpu"):
        m.double()
    with FakeTensorMode(allow_non_fake_inputs=True):  # .cuda() as on a GPU machine
        with pytest.raises(RuntimeError, match=r"would become float32 on cuda:0"):
            m.cuda()
    assert [(n, p.device, p.dtype, p.data_ptr()) for n, p in m.named_parameters()] == before
    assert m.to("cpu") is m and m.float() is m
    _one_step(m, opt)
    assert m.metrics()["steps"] >= 3
    m.close()


@pytest.mark.parametrize("mode,collective", [("ddp", "ar/"), ("fsdp", "ag/")])
def test_the_trace_is_a_perfetto_timeline_of_the_steps(tmp_path, mode, collective):
    # distribute(trace=...) writes the Trace Event Format's JSON object form,
    # which ui.perfetto.dev and chrome://tracing load: every event with a
    # name, a phase of the format, a time, pid (the rank) and tid; complete
    # events with a duration; every async span begun and ended once; the
    # tracks named; the step's collectives, regions and steps in it.
    torch.manual_seed(0)
    m = gt.distribute(GPT(d=64), mode=mode, trace=str(tmp_path / "t-{rank}.json"))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(3):
        _one_step(m, opt)
    path = m.metrics()["trace"]
    m.close()
    assert path == str(tmp_path / "t-0.json"), path
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    assert ev, "an empty trace"
    spans = {}
    for e in ev:
        assert isinstance(e["name"], str) and e["name"], e
        assert e["ph"] in ("X", "B", "E", "i", "I", "C", "b", "e", "n", "M"), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert e["pid"] == 0 and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert e.get("dur", 0) >= 0, e
        if e["ph"] in "be":
            spans.setdefault((e.get("cat"), e["id"]), []).append(e["ph"])
    assert spans and all(sorted(v) == ["b", "e"] for v in spans.values()), spans
    names = {e["name"] for e in ev}
    assert {"process_name", "thread_name", "forward blocks.0", "step 2"} <= names, sorted(names)
    assert any(n.startswith(collective) for n in names), sorted(names)


def test_dump_plan_writes_the_graph_gorun_plan_prints(tmp_path):
    # distribute(dump_plan=...) writes the planned step graph; `gorun plan`
    # reads it and prints the buckets the executor runs, the same number.
    torch.manual_seed(0)
    path = tmp_path / "plan.json"
    m = gt.distribute(GPT(d=64), mode="fsdp", dump_plan=str(path))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(2):  # the first step is measured and planned from
        _one_step(m, opt)
    buckets = m.metrics()["buckets"]
    m.close()
    gorun = os.environ.get("GORUN_BIN", os.path.join(ROOT, "bin", "gorun"))
    if not os.path.isfile(gorun):
        pytest.fail("%s is missing: run `make build` (make test-python does)" % gorun)
    p = subprocess.run([gorun, "plan", "--passes", "", "-json", str(path)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    printed = json.loads(p.stdout)
    names = [b["name"] for b in printed["buckets"]]
    assert buckets > 0 and len(names) == buckets, (buckets, names)
    assert "ag/blocks.0" in names and "ag/blocks.0@bwd" in names, names  # gathered, re-gathered for backward


class _CalledTwice(torch.nn.Module):
    """Three blocks; with again set, the first is called a second time."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])
        self.again = False

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        if self.again:
            x = self.blocks[0](x)
        return x.sum()


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_module_called_twice_in_a_step_is_refused_naming_it(mode):
    # In the measured step (no plan yet) and in a planned one: an error
    # naming the region, never a hang or a silently wrong plan.
    m = _CalledTwice()
    m.again = True
    d = gt.distribute(m, mode=mode)
    with pytest.raises(RuntimeError, match=r"region 'blocks.0' ran twice in one forward"):
        d(torch.randn(2, 8))
    d.close()
    m = _CalledTwice()
    d = gt.distribute(m, mode=mode)
    for _ in range(2):  # measured, then planned
        d(torch.randn(2, 8)).backward()
    assert d.plan() is not None
    m.again = True
    with pytest.raises(GorunError,
                       match=r'region "blocks.0" entered out of the plan\'s order.*a module called twice in one step'):
        d(torch.randn(2, 8))
    d.close()


def test_unknown_mode_and_misplaced_options_are_refused():
    with pytest.raises(ValueError, match="mode 'zero3'"):
        gt.distribute(GPT(), mode="zero3")
    with pytest.raises(ValueError, match="shard_size=2 means nothing in ddp mode"):
        gt.distribute(GPT(), mode="ddp", shard_size=2)
    with pytest.raises(ValueError, match="mode 'hsdp' needs shard_size"):
        gt.distribute(GPT(), mode="hsdp")
    with pytest.raises(TypeError, match="group must be a libgorun communicator handle"):
        gt.distribute(GPT(), group=object())


def test_plan_options_reach_the_planner():
    # One rank: the buckets a bucket cap allows, as the planner makes them.
    def buckets(**kw):
        torch.manual_seed(0)
        m = gt.distribute(GPT(d=64), mode="ddp", **kw)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        x = torch.randint(0, 64, (2, 16))
        for _ in range(2):  # the first step is measured and planned from
            m(x, torch.roll(x, -1, 1)).backward()
            opt.step()
            opt.zero_grad()
        n = m.metrics()["buckets"]
        m.close()
        return n
    whole = buckets(plan_options={"cap_bytes": 64 << 20})
    small = buckets(plan_options={"cap_bytes": 16 << 10})
    assert whole < small, (whole, small)
    with pytest.raises(TypeError, match="plan_options must be a dict"):
        gt.distribute(GPT(), plan_options="cap_bytes=1")
    with pytest.raises(ValueError, match=r"plan_options\['reshard_prefetch'\]: pass it as distribute\(regather_ahead"):
        gt.distribute(GPT(), plan_options={"reshard_prefetch": 1})
