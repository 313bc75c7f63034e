"""A pack cannot hand out the answer (issue 43, point 1), checked by machine: for every task,
no example or page code the model reads holds an epilogue of the task's expert kernel (the
same described graph, or the same quack library epilogue), and no page or example holds the
expert's tuning; a task dropped in as a new folder gets the same."""

import re
import shutil

import pytest

from epiforge import tasks
from epiforge.agent import answers, screen
from epiforge.agent.pack import DOCS_DIR, Doc, HUMAN_DIR, build_pack, without_answers
from epiforge.eval.machine import expert_kernel
from epiforge.tasks.spec import load_task_file

CATALOGUE = tasks.load_catalogue()[0]
WITH_EXPERT = [t for t in CATALOGUE if expert_kernel(t.name)]


def _no_answer_in(pack, epilogues: set, tuned: dict) -> None:
    for name, source in pack.examples.items():
        assert not epilogues & answers.keys(source), f"example {name} holds the expert's epilogue"
        assert not any(shape in line and config in line for line in source.splitlines()
                       for shape, config in tuned.items()), f"example {name} holds the expert's tuning"
    for doc in pack.docs:
        assert not answers.tuning_lines(pack.task, doc.text, tuned), f"page {doc.name} measures the expert's kernel"
        for i, m in enumerate(screen.code_blocks(doc.text), 1):
            assert not epilogues & answers.keys(m.group("body")), f"page {doc.name}, code block {i}"


@pytest.mark.parametrize("task", WITH_EXPERT, ids=[t.id for t in WITH_EXPERT])
def test_no_pack_holds_its_tasks_expert_epilogue_or_tuning(task):
    epilogues, tuned = answers.expert_answers(task)
    assert epilogues, f"{task.id}: its expert's epilogues were not read"  # the check compares something
    _no_answer_in(build_pack(task), epilogues, tuned)


def test_what_the_check_found_in_the_repositorys_pack():
    """The cases the issue found by hand: the layer example held k6's and k7's epilogues;
    the docs' measurement log names every expert's configs; k3's tuned GEMM shapes and
    configs sat in k1's and k4's TUNED tables."""
    for tid in ("k6", "k7"):
        pack = build_pack(tasks.get_task(tid))
        assert "layer_non_attention_fwd_bwd" not in pack.examples
        assert any(w["where"] == "example layer_non_attention_fwd_bwd" and "expert" in w["why"] for w in pack.withheld_code)
        log = pack.doc("logs/h200-expert-kernels")  # every expert's measurements: the task's own lines out
        assert log is not None and answers.TUNING_NOTE in log.text and not re.search(rf"\b{tid}\b.*\dx\d", log.text)
        guide = pack.doc("gemm_config")  # the guide stays, less its sentences that measure the task
        assert guide is not None and answers.TUNING_NOTE in guide.text
    k3 = build_pack(tasks.get_task("k3"))
    _, tuned = answers.expert_answers(tasks.get_task("k3"))
    assert "k1_gemm_rmsnorm" in k3.examples and tuned  # kept, less the lines of k3's own pairs
    assert any(w["where"] == "example k1_gemm_rmsnorm" and "TUNED" in w["why"] for w in k3.withheld_code)


def test_an_epilogue_is_compared_by_what_it_computes():
    def src(f="scale", r="rstd", body="acc * R", kind="PerRow"):
        return (f'import primitives as P\n\n@P.epilogue(operands={{"{r}": P.{kind}()}})\n'
                f'def {f}(acc, {r}):\n    return {{"D": {body.replace("R", r)}}}\n')

    same = answers.keys(src())
    assert same and same == answers.keys(src(f="other_name", r="inv_rms"))  # names do not count
    assert same != answers.keys(src(body="R * acc"))  # the operand order does
    assert same != answers.keys(src(kind="PerCol"))  # so does the operand's kind
    assert same != answers.keys(src(body="acc * R * 1.01"))  # and a constant
    two = ('import primitives as P\n\n@P.epilogue(operands={{"a": P.PerRow(), "b": P.PerCol()}})\n'
           'def f({sig}):\n    return {{"D": acc * a + b}}\n')
    assert answers.keys(two.format(sig="acc, a, b")) == answers.keys(two.format(sig="acc, b, a"))  # nor the signature's order
    assert answers.keys("import primitives as P\nx = P.from_quack('quack.epilogue.library:swiglu_mod')\n") == \
        answers.keys("import primitives as P\ny = P.from_quack('quack.epilogue.library:swiglu_mod')\n")


@pytest.mark.parametrize("copied, example", [("k8_gemm_swiglu", "k8_gemm_swiglu"),
                                             ("k6_gemm_residual_partial_rmsnorm_bwd", "layer_non_attention_fwd_bwd")])
def test_a_task_dropped_in_as_a_folder_gets_no_answer_either(tmp_path, copied, example):
    """A new folder (here a copy of a shipped task under a new name, its expert kernel the
    shipped one's): the example that holds its expert's epilogue is withheld, as for the
    task it copies."""
    folder = tmp_path / f"x9_{copied}_again"
    shutil.copytree(tasks.get_task(copied).folder, folder)
    toml = (folder / "task.toml").read_text()
    toml = re.sub(r'^id = ".*"$', 'id = "x9"', toml, count=1, flags=re.M)
    (folder / "task.toml").write_text(re.sub(r'^name = ".*"$', f'name = "{folder.name}"', toml, count=1, flags=re.M))
    task = load_task_file(folder / "task.toml")
    expert = expert_kernel(copied)
    epilogues, tuned = answers.expert_answers(task, expert)
    # the machine check alone (build_pack screens first: a new task's verdicts are minutes of evaluations)
    docs = [Doc(p.relative_to(DOCS_DIR).with_suffix("").as_posix(), p.read_text()) for p in sorted(DOCS_DIR.rglob("*.md"))]
    examples = {p.stem: p.read_text() for p in sorted(HUMAN_DIR.glob("*.py")) if p.stem != "__init__"}
    assert example in without_answers(task, docs, examples, None)[1]  # no expert of its own: nothing to hide
    kept_docs, kept, _ = without_answers(task, docs, examples, expert)
    assert example not in kept and copied not in kept
    for name, source in kept.items():
        assert not epilogues & answers.keys(source), name
    for doc in kept_docs:
        assert not answers.tuning_lines(task, doc.text, tuned), doc.name


def test_a_pages_lines_measuring_the_task_are_replaced_by_a_note():
    k7 = tasks.get_task("k7")
    _, tuned = answers.expert_answers(k7)
    shape, config = next(iter(tuned.items()))
    page = ("# Tiles\nk7 at 1B takes 1.22x GEMM-only at the default.\nk6 at 1B takes 1.10x GEMM-only.\n"
            f"| {shape} | {config} |\nPick a 128x128 tile for C-loading epilogues.\n"
            "```python\n# k7 128x192 in code stays: code blocks are the screen's\n```\n")
    assert answers.tuning_lines(k7, page, tuned) == [1, 3]  # k7's sentence and its (shape, config) row
    out = answers.without_tuning(page, answers.tuning_lines(k7, page, tuned))
    assert out.count(answers.TUNING_NOTE) == 2 and "k6 at 1B takes 1.10x" in out and "128x128 tile for" in out
    assert "# k7 128x192 in code stays" in out
    assert answers.tuning_lines(tasks.get_task("k6"), page, answers.expert_answers(tasks.get_task("k6"))[1]) == [2]


def test_a_sentence_wrapped_over_lines_is_withheld_whole():
    """k0's session found its measurement in a log's list item whose config was on the next
    line (the line naming k0 held ratios, 1.111, the next line the config): the sentence goes
    whole. A sentence about the model's layers is not the layer task's."""
    k0, layer = tasks.get_task("k0"), tasks.get_task("layer")
    page = ("# Log\n\n- **k0 (residual + RMSNorm statistics): 1B 1.111 / 1.107, 7B 1.066 / 1.066** at\n"
            "  128x128_c1x2_pp (70B: 1.015 / 1.015).\n- k6 at 1B: 1.04x.\n\n"
            "In a layer at d = 8192 the 128x128 pingpong tiles ran at 1.81. Another sentence.\n")
    assert answers.tuning_lines(k0, page, {}) == [2, 3]
    assert answers.tuning_lines(layer, page, {}) == []
    assert answers.tuning_lines(layer, page.replace("a layer", "layer_non_attention_fwd_bwd"), {}) == [6]
    pack = build_pack(k0)
    held = "\n".join(d.text for d in pack.docs)
    assert "1B 1.111 / 1.107" not in held and "128x128_c1x2_pp (70B: 1.015 / 1.015)" not in held
