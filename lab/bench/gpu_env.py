"""GPU-side setup shared by the bench scripts: the environment fingerprint every result
file carries and how a result file is written (lab/bench/rows.py reads them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from epiforge.eval import machine
from epiforge.eval.machine import source_commit  # noqa: F401 (re-exported for bench.report)


def fingerprint(command: str) -> dict:
    """The machine and sources a bench result file came from (eval.machine.fingerprint)."""
    return machine.fingerprint("cuda", command)


_NUMBER_LIST = re.compile(r"\[\n\s*(-?[0-9][0-9.eE+-]*(?:,\n\s*-?[0-9][0-9.eE+-]*)*)\n\s*\]")


def report_json(report: dict) -> str:
    """A result file's text: JSON indented one space per level, except that a list of numbers
    (a timing's samples, one per repetition) stays on one line."""
    text = json.dumps(report, indent=1)
    return _NUMBER_LIST.sub(lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)


def write_report(path, report) -> None:
    """Write a result file of rows (lab.bench.rows.BenchReport, ChainReport), its fields left
    at their defaults left out."""
    Path(path).write_text(report_json(report.model_dump(mode="json", exclude_defaults=True)))
