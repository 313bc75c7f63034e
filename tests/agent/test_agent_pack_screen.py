"""The pack's content rule (agent/screen.py): no code the model reads for task T passes T's
check. Verdicts come from the real evaluator (eval.evaluate on the CPU emulator); the
repository's are shipped in agent/data/screen_cache.json, and a test keeps them complete."""

import ast
import json

import pytest

from epiforge import tasks
from epiforge.agent import screen
from epiforge.agent.pack import build_pack


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EPIFORGE_SCREEN_CACHE", str(tmp_path / "screen_cache.json"))
    return tmp_path / "screen_cache.json"


def _epilogue_returns(src: str):
    """(parameter names, the returned dict's D expression) of every @P.epilogue in src."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return
    for f in ast.walk(tree):
        if isinstance(f, ast.FunctionDef) and any("epilogue" in ast.unparse(d) for d in f.decorator_list):
            for r in ast.walk(f):
                if isinstance(r, ast.Return) and isinstance(r.value, ast.Dict):
                    for k, v in zip(r.value.keys, r.value.values):
                        if isinstance(k, ast.Constant) and k.value == "D":
                            yield [a.arg for a in f.args.args], ast.unparse(v)


def _row_scale_only(params, d_expr) -> bool:
    """D = acc * <the one other parameter> (either order): k1's whole epilogue."""
    if len(params) != 2:
        return False
    other = params[1]
    return d_expr.replace(" ", "") in (f"acc*{other}", f"{other}*acc")


def _code(pack) -> list[str]:
    out = [m.group("body") for d in pack.docs for m in screen.BLOCK.finditer(d.text)]
    return out + list(pack.examples.values())


def test_k1_pack_holds_no_row_scale_epilogue():
    full = [m.group("body") for m in screen.BLOCK.finditer((screen.Path(tasks.__file__).parents[1]
                                                            / "primitive_docs" / "index.md").read_text())]
    assert any(_row_scale_only(p, d) for b in full for p, d in _epilogue_returns(b))  # the page has one ...
    p = build_pack(tasks.get_task("k1"))
    hits = [d for b in _code(p) for params, d in _epilogue_returns(b) if _row_scale_only(params, d)]
    assert hits == []  # ... k1's pack does not
    system = p.system_prompt(speed_target=1.05)
    assert "def row_scale(acc, scale)" not in system and screen.note("page index, code block 1") in system
    # k1's expert's own graph: the machine check (agent/answers.py) withholds it before the screen runs
    assert {"where": "page index, code block 1", "why": "it defines an epilogue of the task's expert kernel (the same graph)"} \
        in p.withheld_code
    assert p.info().withheld_code == p.withheld_code  # what the session log records


def test_other_tasks_keep_the_teaching_examples():
    p = build_pack(tasks.get_task("k8"))
    assert "def row_scale(acc, scale)" in p.doc("index").text
    assert not any(w["where"].startswith("page index") for w in p.withheld_code)
    experts = {f.stem for f in (screen.Path(tasks.__file__).parents[1] / "human_kernels").glob("*.py")} - {"__init__"}
    assert set(build_pack(tasks.get_task("k1")).examples) == experts - {"k1_gemm_rmsnorm"}
    assert "k1_gemm_rmsnorm" in p.examples  # k1's expert is no answer to k8


def test_k3_and_k3hf_do_not_see_each_others_kernel():
    for task, sibling in (("k3", "k3hf_gemm_rope"), ("k3hf", "k3_gemm_rope"),
                          ("k4", "k4hf_gemm_rmsnorm_rope"), ("k4hf", "k4_gemm_rmsnorm_rope")):
        p = build_pack(tasks.get_task(task))
        assert sibling not in p.examples, task
        assert any(w["where"] == f"example {sibling}" for w in p.withheld_code), task
        assert "k8_gemm_swiglu" in p.examples  # unrelated experts stay


def test_the_pack_is_deterministic():
    a, b = build_pack(tasks.get_task("k1")), build_pack(tasks.get_task("k1"))
    assert a.sha256 == b.sha256 and a.withheld_code == b.withheld_code
    assert a.system_prompt(speed_target=1.05) == b.system_prompt(speed_target=1.05)


@pytest.mark.parametrize("name", [t.name for t in tasks.load_catalogue()[0]])
def test_every_verdict_is_shipped(name):
    """Every code block and example of every task's pack has a recorded verdict under
    today's fingerprint (else the pages, or the code that decides a verdict, changed: run
    `python -m epiforge.agent.screen --write`). Blocks holding the expert's own epilogue are
    withheld before the screen (agent/answers.py), so they need none."""
    from epiforge.agent import answers

    task = tasks.get_task(name)
    p = build_pack(task)
    epilogues, _ = answers.expert_answers(task)
    docs = screen.Path(tasks.__file__).parents[1] / "primitive_docs"
    screened = 0
    for page in sorted(docs.rglob("*.md")):
        for m in screen.code_blocks(page.read_text()):
            if not epilogues & answers.keys(m.group("body")):
                assert screen.shipped(task, "block", m.group("body")), (name, page.name)
                screened += 1
    assert screened
    for src in p.examples.values():
        assert screen.shipped(task, "example", src)


@pytest.mark.spawns
def test_a_renamed_answer_is_withheld_by_its_content(tmp_path, user_cache):
    """No name gives it away: an epilogue called mul_rows(acc, r) on a page called
    'scaling' is k1's answer once r is bound to rstd; the evaluator says so. (Written r * acc,
    it is not the expert's graph, acc * rstd, so the machine check of agent/answers.py lets it
    by: the screen, which runs it, does not.)"""
    d = tmp_path / "primitive_docs"
    d.mkdir()
    answer = ('```python\nimport primitives as P\n\n@P.epilogue(operands={"r": P.PerRow()})\n'
              'def mul_rows(acc, r):\n    return {"D": r * acc}\n```\n')
    teaching = ('```python\nimport primitives as P\n\n@P.epilogue(operands={"b": P.PerCol()})\n'
                'def add_bias(acc, b):\n    return {"D": acc + b}\n```\n')
    (d / "index.md").write_text("# Index\n")
    (d / "scaling.md").write_text("# Scaling\nA row scale:\n" + answer + "A bias:\n" + teaching)
    p = build_pack(tasks.get_task("k1"), d)
    text = p.doc("scaling").text
    assert "mul_rows" not in text and "add_bias" in text and "A row scale:" in text
    assert {"where": "page scaling, code block 1", "why": "epilogue mul_rows with r=rstd passes k1's check"} \
        in p.withheld_code
    assert user_cache.is_file()  # the new verdicts were cached ...
    again = build_pack(tasks.get_task("k1"), d)  # ... and give the same pack
    assert again.sha256 == p.sha256
    # for k8 (SwiGLU) the same page stays whole
    assert "mul_rows" in build_pack(tasks.get_task("k8"), d).doc("scaling").text


def test_write_ships_a_verdict_the_user_cache_already_held(tmp_path, user_cache):
    """`python -m epiforge.agent.screen --write` must leave the shipped file complete: a verdict it
    finds in the user cache (a session computed it first) is copied to its target."""
    task = tasks.get_task("k1")
    teaching = 'import primitives as P\n\n@P.epilogue(operands={"b": P.PerCol()})\ndef add_bias(acc, b):\n' \
               '    return {"D": acc + b}\n'
    assert screen.screen_block(task, teaching) is None  # computed now, into the user cache only
    held = json.loads(user_cache.read_text())
    target = tmp_path / "shipped.json"
    assert not target.exists()
    assert screen.screen_block(task, teaching, write_to=target) is None
    assert json.loads(target.read_text()) == held


def test_a_change_in_the_code_behind_the_verdicts_makes_them_stale(tmp_path, monkeypatch):
    """The cache's key holds a fingerprint of what decides a verdict (agent/screen.py, the
    primitives, the shared task code, the CPU evaluation): a change of code there finds no
    shipped verdict; a comment or a docstring changes nothing."""
    task = tasks.get_task("k8")  # a task whose answer the block is not: screened
    block = screen.code_blocks((screen.REPO / "primitive_docs" / "index.md").read_text())[0].group("body")
    assert screen.shipped(task, "block", block)
    today = screen.fingerprint()
    copy = tmp_path / "repo"
    for pattern in screen.VERDICT_SOURCES:
        for path in screen.REPO.glob(pattern):
            (copy / path.relative_to(screen.REPO)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(screen.REPO)).write_bytes(path.read_bytes())
    assert not (copy / "eval" / "baselines.py").exists()  # GPU-only: not behind a CPU verdict
    emulator = copy / "primitives" / "emulator.py"
    original = emulator.read_text()

    def fingerprint_after(text):
        emulator.write_text(text)
        screen.fingerprint.cache_clear()
        return screen.fingerprint()

    with monkeypatch.context() as m:
        m.setattr(screen, "REPO", copy)
        try:
            assert fingerprint_after(original) == today
            assert fingerprint_after("# a comment\n" + original.replace('"""', '"""A reworded docstring. ', 1)) == today
            assert screen.shipped(task, "block", block)
            assert fingerprint_after(original + "\nROUNDING = 'changed'\n") != today
            assert not screen.shipped(task, "block", block)  # stale: recomputed, not served
        finally:
            screen.fingerprint.cache_clear()
    assert screen.fingerprint() == today


def _left_in_pack(task):
    """(kind, source, its adaptations' maker) of every code block still in the task's pack and
    every example it offers."""
    p = build_pack(task)
    left = [("block", m.group("body"), screen.epilogue_adaptations) for d in p.docs for m in screen.code_blocks(d.text)]
    return left + [("example", src, screen.kernel_adaptations) for src in p.examples.values()]


@pytest.mark.parametrize("name", [t.name for t in tasks.load_catalogue()[0]])
def test_no_code_left_in_a_pack_passes_its_task(name):
    """The rule checked per task, apart from the pack's own choice: every code block still in
    T's pack, and every example it offers, has a shipped verdict for T of "nothing passes"."""
    task = tasks.get_task(name)
    verdicts = json.loads(screen.SHIPPED_CACHE.read_text())
    left = _left_in_pack(task)
    assert len(left) > 10
    for kind, src, _ in left:
        verdict = verdicts.get(screen._key(task, kind + "\0" + src))
        assert verdict is not None and verdict["why"] is None, (kind, src.splitlines()[:3], verdict)


def test_every_adaptation_left_in_k1s_pack_failed_its_evaluation():
    """One level down, for k1 (its pack keeps code that adapts to it, unlike k3's or k8's;
    every task this way takes ~75 s more): each adaptation of what is left has a shipped
    evaluation for k1 (eval.evaluate's verdict) that did not pass."""
    task = tasks.get_task("k1")
    verdicts = json.loads(screen.SHIPPED_CACHE.read_text())
    adaptations = [(what, kernel) for _, src, adapt in _left_in_pack(task) for what, kernel in adapt(src, task)]
    assert adaptations
    for what, kernel in adaptations:
        evaluation = verdicts.get(screen._key(task, kernel))
        assert evaluation is not None and evaluation["passed"] is False, (what, evaluation)
