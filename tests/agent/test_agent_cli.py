"""The CLI: light commands import no SDK and no GPU stack; bad input is one clear line."""

import subprocess
import sys

import pytest

from epiforge import cli as epiforge
from epiforge.eval.kernel import REPO


@pytest.mark.spawns
def test_help_imports_no_sdk_and_no_gpu_stack():
    code = ("import sys, epiforge, contextlib, io\n"
            "for argv in (['--help'], ['generate', '--help'], ['replay', '--help'], ['ablate', '--help']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try: epiforge.main(argv)\n"
            "        except SystemExit: pass\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'anthropic', 'openai', 'quack', 'cutlass', 'torch'})\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_missing_key_is_one_line_and_no_log(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    rc = epiforge.main(["generate", "--task", "k1", "--backend", "anthropic", "--log-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["epiforge: anthropic: ANTHROPIC_API_KEY is not set (export it, or choose another --backend)"]
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_log_is_one_line(tmp_path, capsys):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"event": "session_started"}\n{"also": "bad"}\n')
    rc = epiforge.main(["replay", str(log), "--log-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"epiforge: {log}:1: not a valid session event")


def test_fork_needs_a_backend_and_an_unknown_task_is_one_line(tmp_path, capsys):
    assert epiforge.main(["replay", str(tmp_path / "x.jsonl"), "--fork-at", "1"]) == 2
    assert "--fork-at needs --backend" in capsys.readouterr().err
    assert epiforge.main(["generate", "--task", "k99", "--backend", "anthropic"]) == 2
    assert capsys.readouterr().err.startswith("epiforge: unknown task 'k99'")


@pytest.mark.spawns
def test_a_replay_refuses_a_forks_flags_and_says_when_its_recording_has_no_end(tmp_path, capsys):
    """Flags that only a fork uses were silently ignored by a replay (--out), or cut it short
    and called it DIVERGED (--max-turns); a log without its end said 'recorded None'."""
    example = next((REPO / "logs" / "examples").glob("*.jsonl"))
    for flags in (["--max-turns", "3"], ["--out", str(tmp_path / "k")], ["--base-url", "http://x", "--model", "m"]):
        assert epiforge.main(["replay", str(example), "--log-dir", str(tmp_path / "out"), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "only for a fork (--fork-at N --backend ...)" in err[0]
        assert all(f in err[0] for f in flags if f.startswith("--"))
    assert not (tmp_path / "out").exists()
    cut = tmp_path / "cut.jsonl"
    lines = example.read_text().splitlines(keepends=True)
    cut.write_text("".join(line for line in lines if '"session_ended"' not in line))
    rc = epiforge.main(["replay", str(cut), "--log-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 1 and "the recording has no end" in out and "NOT REPRODUCED" in out and "None" not in out


def _subparsers(parser, prefix=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, (*prefix, name))
    yield prefix, parser


def test_every_agent_flag_is_documented_with_its_default():
    import argparse

    from epiforge.agent.cli import DEFAULTS

    parsers = {" ".join(k): p for k, p in _subparsers(epiforge.build_parser())}
    for name in ("generate", "replay", "ablate", "sessions list", "sessions show"):
        for action in parsers[name]._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings[0]} has no help"
            if not isinstance(action, argparse._StoreTrueAction):  # an on/off switch: off unless given
                assert "default" in action.help or "required" in action.help, \
                    f"{name} {action.option_strings[0]}: neither its default nor that it is required is shown"
    generate = {a.dest: a for a in parsers["generate"]._actions}
    assert "required" in generate["task"].help and "required" in generate["backend"].help
    assert f"default: {DEFAULTS['max_turns']}" in generate["max_turns"].help
    assert f"default: {DEFAULTS['max_output_tokens']}" in generate["max_output_tokens"].help
    text = parsers["generate"].format_help()
    assert "ANTHROPIC_API_KEY" in text and "examples:" in text and "epiforge generate --resume" in text
    ablate = {a.dest: a for a in parsers["ablate"]._actions}
    assert all("required" in ablate[d].help for d in ("task", "backend", "pack_without"))
    text = parsers["replay"].format_help()  # a fork goes live through either SDK
    assert "ANTHROPIC_API_KEY" in text and "OPENAI_API_KEY" in text and "examples:" in text
    text = parsers["ablate"].format_help()
    assert "ANTHROPIC_API_KEY" in text and "OPENAI_API_KEY" in text and "examples:" in text
    for name in ("sessions list", "sessions show"):
        text = parsers[name].format_help()
        assert "examples:" in text and f"  epiforge {name}" in text.split("examples:")[1], name


def test_usage_lines_show_required_flags_as_required():
    """A flag a command refuses to run without is never shown as [optional] in its usage."""
    parsers = {" ".join(k): p for k, p in _subparsers(epiforge.build_parser())}
    usage = {name: parsers[name].format_usage() for name in ("generate", "replay", "ablate")}
    assert "--task TASK --backend {anthropic,openai,command} [options]" in usage["generate"]
    assert "epiforge generate --resume LOG" in usage["generate"]
    assert "--fork-at N --backend {anthropic,openai,command}" in usage["replay"]
    assert "--task TASK --backend {anthropic,openai,command} --pack-without DOC" in usage["ablate"]
    assert "epiforge ablate --from-logs DIR" in usage["ablate"]
    for name, text in usage.items():
        for flag in ("--task", "--backend", "--resume", "--fork-at", "--pack-without", "--from-logs"):
            assert f"[{flag} " not in text.replace(f"[{flag} DOC ...]", ""), f"{name}: {flag} shown as optional"
    assert parsers["sessions show"].format_usage().rstrip().endswith(" session")  # the positional: required


def test_required_flags_still_refuse_in_one_line(tmp_path, capsys):
    assert epiforge.main(["ablate", "--task", "k1", "--backend", "anthropic"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "epiforge: ablate needs --task, --backend and at least one --pack-without DOC (or --from-logs DIR)"]
    assert epiforge.main(["generate", "--task", "k1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "epiforge: generate needs --task and --backend (or --resume LOG)"]


def test_sessions_show_of_an_unknown_id_is_one_line(tmp_path, capsys):
    assert epiforge.main(["sessions", "show", "nope", "--log-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"epiforge: no session 'nope' in {tmp_path} (epiforge sessions list shows them)"]


def test_an_option_the_backend_would_ignore_is_refused(tmp_path, capsys):
    common = ["generate", "--task", "k1", "--log-dir", str(tmp_path / "logs")]
    assert epiforge.main([*common, "--backend", "command", "--command", "true", "--base-url", "http://x",
                          "--max-retries", "2"]) == 2
    assert capsys.readouterr().err.strip() == ("epiforge: --base-url, --max-retries: options of the API backends; "
                                               "--backend command runs a local command")
    assert epiforge.main([*common, "--backend", "anthropic", "--command", "true"]) == 2
    assert capsys.readouterr().err.strip() == "epiforge: --command: for --backend command, not anthropic"
    assert epiforge.main([*common, "--backend", "anthropic", "--no-sandbox", "--sandbox-expose", "/x"]) == 2
    assert capsys.readouterr().err.strip() == ("epiforge: --sandbox / --no-sandbox, --sandbox-expose: for --backend "
                                               "command, not anthropic")
    assert not (tmp_path / "logs").exists()
