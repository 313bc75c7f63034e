"""Packaging: the repository's top-level folders install under the one name `epiforge`
(epiforge.eval, epiforge.tasks, ...), never as generic top-level modules; the data folders
travel inside it too. The rest of the metadata is in pyproject.toml."""

from pathlib import Path

from setuptools import find_packages, setup

#: folders with Python code: installed as epiforge.<name>, with their subpackages
CODE = ("primitives", "tasks", "eval", "agent", "training", "human_kernels")
#: data folders the code reads at run time (epiforge.ROOT / name)
DATA = ("primitive_docs", "generated_kernels", "logs")
#: what the code folders carry besides Python
CODE_DATA = ["*.toml", "*.md", "*.j2", "*.jsonl", "*.json"]


def _data_tree(folder: Path, name: str) -> list[str]:
    """The folders under package `folder` (named `name`) that are no package themselves
    (data/, templates/ and theirs), all their files travelling. One whose path is named like
    modules becomes a package of data files itself, listed, since setuptools warns of an
    unlisted data folder that looks like a package; the others (a name with a hyphen) travel
    as "<folder>/*" globs of the nearest package. Returns the globs."""
    globs = []
    for d in sorted(c for c in folder.iterdir() if c.is_dir()):
        if d.name == "__pycache__" or (d / "__init__.py").is_file():
            continue
        if d.name.isidentifier():
            _add(d, f"{name}.{d.name}", ["*"])
            package_data[f"{name}.{d.name}"] += _data_tree(d, f"{name}.{d.name}")
        else:
            globs += [f"{sub.relative_to(folder).as_posix()}/*" for sub in [d, *sorted(d.rglob("*"))] if sub.is_dir()]
    return globs


def _add(folder: Path, name: str, data: list[str]) -> None:
    packages.append(name)
    package_dir[name] = folder.as_posix()
    package_data[name] = list(data)


packages, package_dir, package_data = ["epiforge"], {"epiforge": "epiforge"}, {}
for top in CODE:
    for sub in [top, *(f"{top}.{p}" for p in find_packages(top))]:
        folder = Path(sub.replace(".", "/"))
        _add(folder, f"epiforge.{sub}", CODE_DATA)
        package_data[f"epiforge.{sub}"] += _data_tree(folder, f"epiforge.{sub}")
for top in DATA:
    for folder in [Path(top), *sorted(p for p in Path(top).rglob("*") if p.is_dir())]:
        name = "epiforge." + ".".join(folder.parts)
        packages.append(name)
        package_dir[name] = str(folder)
        package_data[name] = ["*"]

setup(packages=packages, package_dir=package_dir, package_data=package_data)
