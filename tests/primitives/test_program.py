"""A kernel's calls as data (primitives/program.py): every expert kernel, described on fake
tensors (on the CPU's device or a GPU's, no GPU needed) and run again from the description's JSON by the primitives' own code, gives its
outputs bit for bit; run()'s own torch work is visible step by step; what reads a value
does not describe; a description from an untrusted writer is checked before it runs; and
running a description runs no kernel code."""

import json
import types

import pytest
import torch

from epiforge import primitives as P
from epiforge import tasks
from epiforge.eval.machine import expert_kernel
from epiforge.primitives import program, trace
from epiforge.tasks.tolerance_margins import load_expert, run_expert

TASKS = [t for t in tasks.load_catalogue()[0] if expert_kernel(t.name)]
def _smoke(task):
    return task.make_inputs(next(s.dims() for s in tasks.shape_sets()["smoke"]), seed=3, device="cpu")


def _describe(task, module, inputs, device="cpu"):
    specs = {k: program.spec_of(v) for k, v in inputs.items()}
    return program.describe(module, specs, tuple(t.name for t in task.inputs if t.constant), device)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].stride() == b[k].stride()
        and torch.equal(a[k].nan_to_num(7.0), b[k].nan_to_num(7.0)) and torch.equal(a[k].isnan(), b[k].isnan())
        for k in a)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_every_expert_kernel_runs_from_its_description_bit_for_bit(task):
    module = load_expert(task)
    inputs = _smoke(task)
    described = program.Program.from_json(_describe(task, module, inputs).to_json())
    direct = run_expert(task, module, inputs)
    got, done = program.execute(described, {k: v.clone() if isinstance(v, torch.Tensor) else v
                                            for k, v in inputs.items()})
    assert _same(direct, got), task.id
    run_ops = {s["name"] for s in described.run_steps() if s["kind"] == "aten"}
    assert run_ops <= program.VIEWS, run_ops  # an expert's run() computes nothing itself
    assert any(s["kind"] == "gemm" for s in described.run_steps())
    assert sum(d.startswith("gemm:") for d in done) == sum(s["kind"] == "gemm" for s in described.steps)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_an_expert_kernel_describes_the_same_for_a_gpu(task):
    """Described for the GPU (its values fake CUDA tensors, on this CPU machine), an expert
    kernel makes the same calls: the description is the GPU's kernel, not a CPU path of it."""
    module, inputs = load_expert(task), _smoke(task)
    assert _describe(task, module, inputs, "cuda").to_json() == _describe(task, module, inputs).to_json()


def test_a_kernel_sees_the_judges_device_while_described():
    """device_test_in_run.py's trick: run() picks an epilogue by its inputs' device. Described
    for the GPU it sees a CUDA tensor, so the description holds the GPU branch, the one the
    launcher then runs and the judge checks."""
    module = _kernel("return {'out': bias(inputs['a'], inputs['w'], b=inputs['b'] if inputs['a'].is_cuda "
                     "else inputs['b'] * 0)['D']}")
    ops = {dev: [s["name"] for s in program.describe(module, _specs(_inputs()), (), dev).steps if s["kind"] == "aten"]
           for dev in ("cpu", "cuda")}
    assert ops["cuda"] == [] and ops["cpu"] == ["aten::mul.Tensor"]  # the GPU branch is honest here
    with pytest.raises(program.ProgramError, match="cpu or cuda"):
        program.describe(module, _specs(_inputs()), (), "meta")


def _kernel(run_body: str, prepare_body: str | None = None):
    """A kernel module made in the test: one @epilogue, run() as given."""
    scope = {"P": P, "torch": torch}
    source = ("@P.epilogue(operands={'b': P.PerCol()})\n"
              "def bias(acc, b):\n"
              "    return {'D': acc + b}\n\n"
              f"def run(inputs, prepared):\n    {run_body}\n")
    if prepare_body:
        source += f"\ndef prepare(consts):\n    {prepare_body}\n"
    exec(source, scope)  # noqa: S102 - the test's own kernels
    module = types.ModuleType("made_kernel")
    module.__dict__.update(scope)
    return module


def _inputs():
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(64, 32, generator=g).bfloat16(), "w": torch.randn(48, 32, generator=g).bfloat16(),
            "b": torch.randn(48, generator=g), "eps": 1e-6}


def _specs(inputs):
    return {k: program.spec_of(v) for k, v in inputs.items()}


def test_the_kernels_own_compute_is_a_step_the_launcher_sees():
    """torch compute in run() (here the whole GEMM again, as a cheat would) is a recorded
    aten step of its own, beside the fused GEMM; a view is one too, and a Python number
    derived from shapes is a constant of the step."""
    module = _kernel("x = inputs['a'] @ inputs['w'].T\n"
                     "    y = bias(inputs['a'], inputs['w'], b=inputs['b'] * (1.0 / inputs['a'].shape[1]))\n"
                     "    return {'y': y['D'], 'x': x}")
    described = program.describe(module, _specs(_inputs()), ())
    names = [(s["kind"], s["name"]) for s in described.run_steps()]
    assert ("aten", "aten::mm") in names and ("aten", "aten::permute") in names and ("aten", "aten::mul.Tensor") in names
    assert [k for k, _ in names].count("gemm") == 1
    mul = next(s for s in described.steps if s["name"] == "aten::mul.Tensor")
    assert mul["args"][1] == 1.0 / 32
    inputs = _inputs()
    got, done = program.execute(program.Program.from_json(described.to_json()), inputs)
    want = module.run(_inputs(), {})
    assert torch.equal(got["x"], want["x"]) and torch.equal(got["y"], want["y"])
    assert "aten:aten::mm" in done and "gemm:bias" in done


def test_running_a_description_runs_no_kernel_code():
    """What execute() runs is the primitives' code on the description: with the kernel's
    run() and its epilogue's function made to raise after describing, the description still
    runs, to the values the kernel gave."""
    module = _kernel("return {'y': bias(inputs['a'], inputs['w'], b=inputs['b'])['D']}")
    described = program.describe(module, _specs(_inputs()), ())
    want = module.run(_inputs(), {})["y"]

    def sabotaged(*args, **kwargs):
        raise AssertionError("kernel code ran")
    module.run = module.bias.fn = module.bias.torch_fn = sabotaged
    got, done = program.execute(program.Program.from_json(described.to_json()), _inputs())
    assert torch.equal(got["y"], want) and done == ["gemm:bias"]


@pytest.mark.parametrize("body, why", [
    ("return {'y': inputs['a'] * float(inputs['b'][0])}", "read a tensor's values"),
    ("return {'y': inputs['a'][inputs['a'] > 0]}", "read a tensor's values"),
    ("return {'y': HELD}", "did not make"),
    ("return {'y': inputs['a'].tolist()}", "read a tensor's values"),
    ("return [inputs['a']]", "must return a dict"),
])
def test_a_kernel_that_needs_values_does_not_describe(body, why):
    module = _kernel(body)
    module.run.__globals__["HELD"] = torch.ones(3)
    with pytest.raises(program.ProgramError, match=why):
        program.describe(module, _specs(_inputs()), ())
    assert not program.describing()  # the describer is gone after a failure


def test_the_kernels_own_exception_comes_out_as_it_is():
    """Raised by the kernel's code while described, an exception is the kernel's, as when it
    runs (the runner then gives it the same outcome and traceback as in its own process)."""
    module = _kernel("raise KeyError('no such input')")
    with pytest.raises(KeyError, match="no such input"):
        program.describe(module, _specs(_inputs()), ())
    assert not program.describing()


def test_prepare_steps_come_first_and_are_counted_apart():
    module = _kernel("return {'y': bias(inputs['a'], inputs['w'], b=prepared['b2'])['D']}",
                     "return {'b2': consts['b'] * 2}")
    inputs = _inputs()
    described = program.describe(module, _specs(inputs), ("b",))
    assert described.prepare_steps == 1 and described.steps[0]["name"] == "aten::mul.Tensor"
    assert [s["kind"] for s in described.run_steps()] == ["gemm"]
    got, _ = program.execute(described, inputs)
    assert torch.equal(got["y"], module.bias(inputs["a"], inputs["w"], b=inputs["b"] * 2)["D"])


def test_a_description_that_is_not_well_formed_is_refused():
    module = _kernel("return {'y': bias(inputs['a'], inputs['w'].T.T, b=inputs['b'])['D']}")
    good = json.loads(program.describe(module, _specs(_inputs()), ()).to_json())

    def refused(change, why):
        data = json.loads(json.dumps(good))
        change(data)
        with pytest.raises(program.ProgramError, match=why):
            program.Program.from_json(json.dumps(data))

    refused(lambda d: d["steps"][0]["args"].__setitem__(0, {"v": 99}), "not made before")
    refused(lambda d: d["steps"][0].update(kind="python"), "not a step")
    refused(lambda d: d["steps"][0].update(name="os.system"), "not an aten operation")
    refused(lambda d: d["steps"][0]["outs"].update(v=0), "in order")
    refused(lambda d: d["steps"][0]["args"].append({"pickle": "x"}), "unknown argument")
    refused(lambda d: d["outputs"].update(y={"v": 1000}), "no value")
    refused(lambda d: d.update(prepare_steps=99), "prepare_steps")
    refused(lambda d: d.pop("n_values"), "not a kernel program")
    refused(lambda d: d["steps"][0].update(args={"v": 0}), "not a step")
    refused(lambda d: d["steps"][0].update(name="aten::from_file"), "not an aten operation a kernel may use")
    refused(lambda d: d["steps"][0]["args"].append({"dtype": "complex256"}), "unknown argument")
    refused(lambda d: d.update(inputs=[5]), "not a kernel program")
    with pytest.raises(program.ProgramError, match="not an epilogue"):
        data = json.loads(json.dumps(good))
        gemm = next(s for s in data["steps"] if s["kind"] == "gemm")
        gemm["name"] = json.dumps({"graph": {"params": ["acc"], "nodes": [], "returns": []}, "name": "x"})
        program.execute(program.Program.from_json(json.dumps(data)), _inputs())


def test_a_call_off_its_epilogues_contract_fails_as_it_would_when_run():
    """An EpilogueError (the runner's COMPILE_ERROR) comes out of describe() as itself."""
    module = _kernel("return {'y': bias(inputs['a'], inputs['w'], b=inputs['a'])['D']}")
    with pytest.raises(P.EpilogueError, match="b"):
        program.describe(module, _specs(_inputs()), ())
    assert not program.describing()


def test_prepared_once_run_many_times_with_fresh_outputs():
    """Executable: prepare()'s steps once per input set, run() again and again on them; each
    run makes new tensors (the judge's fresh-buffer checks hold) with the same values."""
    module = _kernel("return {'y': bias(inputs['a'], inputs['w'], b=prepared['b2'])['D']}",
                     "return {'b2': P.prepare.rope_freq_table(consts['f'], 4, 48)[:48] + consts['b']}")
    inputs = {**_inputs(), "f": torch.rand(2)}
    runnable = program.Executable(program.describe(module, _specs(inputs), ("b", "f")))
    with trace.recording() as in_prepare:
        table = runnable.prepare(inputs)
    with trace.recording() as in_runs:
        first, done = runnable.run(table)
        second, _ = runnable.run(table)
    assert in_prepare == ["prepare:rope_freq_table"] and not any(c.startswith("prepare:") for c in in_runs)
    assert done == ["gemm:bias"] and torch.equal(first["y"], second["y"])
    assert first["y"].untyped_storage().data_ptr() != second["y"].untyped_storage().data_ptr()


@pytest.mark.parametrize("kind, name, why", [("finish", "register", "unknown finishing step"),
                                             ("prepare", "_helper", "unknown prepare helper"),
                                             ("aten", "aten::no_such_op", "unknown aten operation")])
def test_a_description_names_only_the_primitives_own_steps(kind, name, why):
    """A step's name is looked up among the registered finishing steps, prepare helpers and
    aten operations, never as an attribute of a module (P.finish.register is no step)."""
    module = _kernel("return {'y': bias(inputs['a'], inputs['w'], b=inputs['b'])['D']}")
    described = program.describe(module, _specs(_inputs()), ())
    described.steps.insert(0, {"kind": kind, "name": name, "args": [], "kwargs": {}, "outs": None})
    with pytest.raises(program.ProgramError, match=why):
        program.execute(described, _inputs())


def test_allocations_with_every_keyword_describe():
    """torch.empty / empty_like / zeros with dtype, layout and device keywords in run():
    described and run again (an allocation is no launch; zeros is a fill, which is)."""
    body = ("d = bias(inputs['a'], inputs['w'], b=inputs['b'])['D']\n"
            "    e = torch.empty_like(d, dtype=torch.float32, layout=torch.strided, device=d.device)\n"
            "    z = torch.zeros(4, dtype=torch.float32, device=d.device)\n")
    module = _kernel(body + "    return {'y': d, 'z': z, 'e_dtype': e.dtype}")
    described = program.Program.from_json(program.describe(module, _specs(_inputs()), ()).to_json())
    got, done = program.execute(described, _inputs())
    assert got["e_dtype"] == torch.float32 and torch.equal(got["z"], torch.zeros(4))
    assert any(d.startswith("aten:aten::empty") for d in done) and any("zero" in d or "fill" in d for d in done)
    # an output no fused GEMM or finishing step made (a bare allocation, an input, a view of
    # either) is refused (issue 42): here the allocation, and a view of an input
    for returned, what in (("{'y': d, 'e': e.t()}", "'e' is a bare allocation"),
                           ("{'y': d, 'a': inputs['a'][:, :8]}", "'a' is an input")):
        with pytest.raises(program.ProgramError, match=what):
            program.describe(_kernel(body + f"    return {returned}"), _specs(_inputs()), ())


def test_the_device_test_exploit_describes_its_gpu_branch_for_a_gpu():
    """tests/exploits/device_test_in_run.py picks an epilogue without the row scale when its
    inputs are on a GPU: described for the GPU, that cheat is what the launcher would run
    (and the judge reject); described for the CPU, the honest branch."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "exploits" / "device_test_in_run.py"
    spec = importlib.util.spec_from_file_location("device_test_in_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    task = tasks.get_task(module.TASK)
    inputs = _smoke(task)
    names = {dev: [json.loads(s["name"])["name"] for s in _describe(task, module, inputs, dev).steps
                   if s["kind"] == "gemm"] for dev in ("cpu", "cuda")}
    assert names == {"cpu": ["row_scale"], "cuda": ["plain"]}
