"""epiforge/text.py: counts in the commands' output take the noun's number ('1 turn', not
'1 turns'), as the leaderboard's source line shows."""

from epiforge.text import counted


def test_a_count_takes_the_noun_in_its_number():
    assert [counted(n, "turn") for n in (0, 1, 2, 30)] == ["0 turns", "1 turn", "2 turns", "30 turns"]
    assert counted(1, "repetition", "repetitions") == "1 repetition"
    assert counted(3, "process", "processes") == "3 processes"


def test_the_leaderboard_names_one_result_in_the_singular():
    from epiforge.eval.leaderboard import describe_source
    from epiforge.eval.result import Result

    one = Result.model_construct(environment={"gpu": "NVIDIA H200", "date": "2026-12-06"}, started_at=None)
    assert describe_source([one], "shipped (x.jsonl)") == "shipped (x.jsonl): 1 result (NVIDIA H200, 2026-12-06)"
    assert describe_source([one, one], "s").startswith("s: 2 results (")
