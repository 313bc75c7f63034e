"""Packaging: the repository's top-level folders install under the one name `epiforge`
(epiforge.eval, epiforge.tasks, ...), never as generic top-level modules; the data folders
travel inside it too. The rest of the metadata is in pyproject.toml."""

from pathlib import Path

from setuptools import find_packages, setup

#: folders with Python code: installed as epiforge.<name>, with their subpackages
CODE = ("primitives", "tasks", "eval", "agent", "training", "human_kernels", "bench")
#: data folders the code reads at run time (epiforge.ROOT / name)
DATA = ("primitive_docs", "generated_kernels", "logs")
#: what the code folders carry besides Python
CODE_DATA = ["*.toml", "*.md", "*.j2", "*.jsonl", "*.json", "*.sh"]



def _data_folders(package: Path) -> list[str]:
    """The folders under a package that are no package themselves (data/, results/, logs/,
    templates/ and theirs): every file in them travels, as "<folder>/*" of that package."""
    found, todo = [], [d for d in package.iterdir() if d.is_dir()]
    while todo:
        d = todo.pop()
        if d.name == "__pycache__" or (d / "__init__.py").is_file():
            continue
        found.append(f"{d.relative_to(package).as_posix()}/*")
        todo += [c for c in d.iterdir() if c.is_dir()]
    return sorted(found)


packages, package_dir, package_data = ["epiforge"], {"epiforge": "epiforge"}, {}
for top in CODE:
    for sub in [top, *(f"{top}.{p}" for p in find_packages(top))]:
        folder = sub.replace(".", "/")
        packages.append(f"epiforge.{sub}")
        package_dir[f"epiforge.{sub}"] = folder
        package_data[f"epiforge.{sub}"] = CODE_DATA + _data_folders(Path(folder))
for top in DATA:
    for folder in [Path(top), *sorted(p for p in Path(top).rglob("*") if p.is_dir())]:
        name = "epiforge." + ".".join(folder.parts)
        packages.append(name)
        package_dir[name] = str(folder)
        package_data[name] = ["*"]

setup(packages=packages, package_dir=package_dir, package_data=package_data)
