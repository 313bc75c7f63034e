"""The lab's tests run in the suite (pyproject.toml testpaths) under the repository's test
setup (conftest.py), except the quack patch's: it cross-compiles 15 GEMMs twice and runs
its GPU runner over every case (about 100 s of CI's 2 cores), so it runs only when named:

    .venv/bin/python -m pytest -q -p no:cacheprovider lab/tests/test_quack_upstream.py
"""

collect_ignore = ["test_quack_upstream.py"]
