"""The knowledge pack (pages discovered, the task's own pages and example withheld, ablations,
hashing, prompt rendering) and the small pieces the loop builds on (feedback, kernel stamping)."""

import ast

import pytest

import epiforge.agent.pack as pack_mod
from epiforge import tasks
from epiforge.agent.feedback import scrub
from epiforge.agent.loop import write_generated
from epiforge.agent.pack import PackError, build_pack
from epiforge.eval.kernel import REPO, read_kernel


@pytest.fixture
def docs(tmp_path):
    d = tmp_path / "primitive_docs"
    (d / "logs").mkdir(parents=True)
    (d / "index.md").write_text("# Index\nINDEX-MARKER: start here.\n")
    (d / "operands.md").write_text("# Operands\nPerRow, PerCol. OPERANDS-MARKER\n")
    (d / "pairs.md").write_text("# Pairs\nacc_pair mode for swiglu. PAIRS-MARKER\n")
    (d / "logs" / "k8_swiglu.md").write_text("how k8 was done: the answer. K8-LOG-MARKER\n")
    (d / "logs" / "k0.md").write_text("how k0 was done. K0-LOG-MARKER\n")
    (d / "worked.md").write_text('A whole kernel file:\n```python\nTASK = "k8_gemm_swiglu"\n```\n')
    return d


def test_pages_are_discovered_and_the_tasks_own_are_withheld(docs):
    p = build_pack(tasks.get_task("k8"), docs)
    assert sorted(d.name for d in p.docs) == ["index", "logs/k0", "operands", "pairs"]
    assert p.withheld == ["logs/k8_swiglu", "worked"]
    experts = {f.stem for f in pack_mod.HUMAN_DIR.glob("*.py")} - {"__init__"}
    assert "k8_gemm_swiglu" not in p.examples and set(p.examples) == experts - {"k8_gemm_swiglu"}
    system = p.system_prompt(speed_target=1.05)
    assert "K8-LOG-MARKER" not in system
    # index first, then the page that matches the task (swiglu), then the rest, logs last
    order = [system.index(m) for m in ("INDEX-MARKER", "PAIRS-MARKER", "OPERANDS-MARKER", "K0-LOG-MARKER")]
    assert order == sorted(order)


def test_a_page_can_be_left_out_and_the_hash_says_so(docs):
    task = tasks.get_task("k8")
    full = build_pack(task, docs)
    without = build_pack(task, docs, ["operands"])
    assert without.doc("operands") is None and full.doc("operands") is not None
    assert "OPERANDS-MARKER" not in without.system_prompt(speed_target=1.05)
    assert without.info().without == ["operands"]
    assert without.sha256 != full.sha256
    (docs / "index.md").write_text("# Index\nchanged\n")
    assert build_pack(task, docs).sha256 != full.sha256


def test_an_unknown_or_ambiguous_page_is_one_clear_error(docs):
    (docs / "logs" / "operands.md").write_text("a log named like a page\n")
    (docs / "worked.md").unlink()
    task = tasks.get_task("k8")
    with pytest.raises(PackError, match="'nope' matches no page; pages: index"):
        build_pack(task, docs, ["nope"])
    with pytest.raises(PackError, match="ambiguous"):
        build_pack(task, docs, ["operands.md"])
    assert build_pack(task, docs, ["logs/operands"]).doc("operands") is not None


def test_pages_beyond_the_prompt_budget_are_listed_for_read_doc(docs, monkeypatch):
    monkeypatch.setattr(pack_mod, "PROMPT_DOC_CHARS", 60)
    p = build_pack(tasks.get_task("k8"), docs)
    inside, outside = p.prompt_docs()
    assert [d.name for d in inside] == ["index"]
    system = p.system_prompt(speed_target=1.05)
    assert "Further pages (read them with read_doc): `pairs`" in system and "PAIRS-MARKER" not in system


def test_the_real_pack_and_task_prompt_render():
    task = tasks.get_task("k5")
    p = build_pack(task)
    prompt = p.task_prompt(speed_target=1.05)
    for needle in ("k5_gemm_rmsnorm_partial_cross_entropy", "`targets`", "`cross_entropy`", "TASK = \"k5_"):
        assert needle in prompt
    assert "k5_gemm_rmsnorm_partial_cross_entropy.py" not in prompt  # never its own expert kernel
    assert len(p.prompt_examples()) == 2


def test_precision_tensors_are_shown_as_the_precision_judged_not_as_bf16():
    p = build_pack(tasks.get_task("k1"))
    prompt = p.task_prompt(speed_target=1.05)
    judged = "precision (each of bfloat16 and float16: the kernel is judged in every one)"
    assert f"- `h` [M, d] {judged}: " in prompt and f"- `out` [M, 3*d] {judged}: " in prompt
    assert "- `rstd` [M] float32: " in prompt  # a fixed dtype stays as it is
    assert "] bfloat16" not in prompt and "every check judges the kernel in each of bfloat16 and float16" in prompt
    assert "judged in every precision its task lists, bf16 and fp16" in p.system_prompt(speed_target=1.05)


def test_generated_kernels_are_stamped_and_never_overwritten(tmp_path):
    source = 'import primitives as P\n\nTASK = "k1_gemm_rmsnorm"\nMODEL = "made up by the model"\n\n\ndef run(inputs, prepared, config=None):\n    return {}\n'
    path = write_generated(source, "k1_gemm_rmsnorm", "S1", "openai", 'qwen "coder"', tmp_path)
    meta = read_kernel(path)
    assert (meta.session, meta.backend, meta.model, meta.task) == ("S1", "openai", 'qwen "coder"', "k1_gemm_rmsnorm")
    ast.parse(path.read_text())
    assert path.read_text().count("MODEL =") == 1
    first = path.read_text()
    # a resumed session that passes again with the same kernel: the file is kept, no error
    assert write_generated(source, "k1_gemm_rmsnorm", "S1", "openai", 'qwen "coder"', tmp_path) == path
    # another text for the same session never replaces the first: it goes beside it
    other = write_generated(source, "k1_gemm_rmsnorm", "S1", "openai", "m", tmp_path)
    assert other != path and other.parent == path.parent and other.name.startswith("S1-")
    assert path.read_text() == first and read_kernel(other).model == "m"
    # line breaks Python does not count (a form feed, U+2028) move no stamp and wake no comment
    tricky = ('import primitives as P\n\nTASK = "k1_gemm_rmsnorm"\n# note\u2028SCALE = 2.0\nSCALE = 1.0\n'
              'SESSION = "forged"\n\n\ndef run(inputs, prepared, config=None):\n    return {}\n')
    saved = write_generated(tricky, "k1_gemm_rmsnorm", "S3", "openai", "m", tmp_path).read_text()
    assert "# note\u2028SCALE = 2.0\nSCALE = 1.0\n" in saved and "forged" not in saved


def test_scrub_hides_this_machines_paths(tmp_path):
    text = f'File "{REPO}/eval/worker.py", line 3; File "{tmp_path}/kernel.py"'
    assert scrub(text, tmp_path) == 'File "<repo>/eval/worker.py", line 3; File "./kernel.py"'


def test_the_task_page_names_the_timed_shapes_gemms_as_tuned_keys():
    """An agent asked which GEMM shapes the paper sizes are (k5l's session copied another
    task's TUNED keys without knowing whether they would ever be picked)."""
    task = tasks.get_task("k5l")
    line = next(x for x in build_pack(task).task_prompt(speed_target=1.05).splitlines() if x.startswith("Timed shapes"))
    for s in tasks.shape_sets()["paper"]:
        (m, n, k), = task.gemm_shapes(s.dims())
        assert f"{s.name}: M={s.M}" in line and f"GEMM {m}x{n}x{k}" in line
    assert "16384x32768x2048" in line  # the key the expert's TUNED table uses for 1B
