"""lab.generated_configs: TUNED tables read from source, never imported."""

from types import SimpleNamespace

from epiforge.primitives.config import DEFAULT_CONFIG, pick_config
from lab.generated_configs import config_at, literal_table, study, table_source


def test_tables_are_read_without_running_the_module(tmp_path):
    ran = tmp_path / "ran"
    src = tmp_path / "k.py"
    src.write_text(f"open({str(ran)!r}, 'w')\nTUNED = {{'16x32x64': '128x128_c1x2_pp'}}\n")
    assert literal_table(src) == {"16x32x64": "128x128_c1x2_pp"}
    assert not ran.exists()
    src.write_text("TUNED = dict(a=1)\n")
    assert literal_table(src) == "not a literal"
    src.write_text("X = 1\n")
    assert literal_table(src) is None


def test_config_at_is_pick_config_on_the_literal_table():
    table = {"16384x2048x2048": "128x192_c2x1_pp", "16384x8192x8192": "128x128_c1x2_pp_cs2"}
    for mnk in [(16384, 2048, 2048), (16384, 4096, 4096), (16384, 16384, 8192), (1, 1, 1)]:
        m, n, k = mnk
        want = pick_config(table, SimpleNamespace(shape=(m, k)), SimpleNamespace(shape=(n, k))).key()
        assert config_at(table, mnk) == want
    assert config_at(table, (16384, 8192, 8192)) == "128x128_c1x2_pp_cs2"
    assert config_at(None, (16384, 8192, 8192)) == DEFAULT_CONFIG.key()


def test_a_copied_table_names_the_expert_it_came_from():
    experts = {"k8": {"a": "x", "b": "y"}, "k2": {"a": "z"}}
    assert table_source({"a": "x"}, "k5", experts) == "the expert table of k8"
    assert table_source({"a": "x"}, "k8", experts) == "own"  # its own task's expert is no donor
    assert table_source({"a": "q"}, "k5", experts) == "own"
    assert table_source({}, "k5", experts) == "empty"
    assert table_source(None, "k5", experts) == "none"


def test_every_shipped_real_session_kernel_is_read():
    rows = study("paper")
    assert rows and all(len(r["shapes"]) == 3 for r in rows)
    assert all(r["kernel"].startswith("generated_kernels/") for r in rows)
    assert not any("a840f4" in r["session"] for r in rows)  # the scripted replay is not a real session
