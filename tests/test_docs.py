"""The documentation cannot drift from the code or the repository: README and docs/governance.md state what
epsilon covers in the words the code generates (models/privacy/statement.py), README stays a short
newcomer's page, every repository path and module the documents name exists, and nothing refers to a
file outside the repository."""

import re
import subprocess
from pathlib import Path

import pytest

from dpsynth.models.config import load_profile
from dpsynth.tasks.decision import statement_for
from tests.conftest import CARDIO_SCHEMA, ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
STATEMENT_PAGE = DOCS / "governance.md"
README_MAX_WORDS = 1200
# The two commands a fresh machine runs; CI and reviewers copy them from README as they are.
MAIN_JOB_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints.txt -e . && dpsynth release --config "
    "configs/cardio.yaml --data ../shared/data/cardio_train.csv --profile default --json"
)
TEST_COMMAND = (
    'python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints.txt -e ".[dev]" && python -m pytest'
)
REAL_TABLE_ARGUMENT = "--data ../shared/data/cardio_train.csv"
# A path into the repository: one of its top-level folders, then a file or folder name. A folder name
# glued to a longer one (`~/.dpsynth/...`, `/srv/dpsynth/...`) is not a repository path.
REPOSITORY_PATH = re.compile(
    r"(?<![\w./~$-])((?:bench|configs|docs|dpsynth|expectations|flows|models|tasks|tests)/[\w./<>*-]*)"
)
# A test named the way pytest names it (`tests/models/test_x.py::test_y`).
TEST_NODE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
# A module of the installed layers, named the way code imports it (`dpsynth.models.data.schema`).
LAYER_MODULE = re.compile(r"(?<![\w.])dpsynth\.((?:configs|flows|models|tasks)(?:\.\w+)*)")
BENCH_MODULE = re.compile(r"python -m bench\.([a-z_]\w*)")  # NAME: a placeholder
# Files outside the repository that documents and code once cited. Written so this file does not match.
OUTSIDE_FILES = re.compile(r"\b(?:REFERENCE|DESIGN)\.md\b|\bseeds[/]", re.IGNORECASE)


def _documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _default_release_statement():
    profile = load_profile("default", CARDIO_SCHEMA)
    return statement_for(profile, profile.release_target(), release=True)


def _uncovered_head(item: str) -> str:
    """An uncovered item's opening words, before its explanation (a colon, parenthesis or 'if any')."""
    return re.split(r"[:(]|, if any", item)[0].strip()


def test_statement_page_carries_the_generated_statement_of_the_default_release_word_for_word():
    statement = _default_release_statement()
    page = _one_line(STATEMENT_PAGE.read_text())
    for text in (statement.covers, *statement.does_not_cover, statement.internal_only):
        assert _one_line(text) in page, f"{STATEMENT_PAGE.name} lacks, word for word:\n{text}"


def test_readme_says_what_epsilon_covers_and_does_not_in_the_generated_words():
    statement = _default_release_statement()
    readme = _one_line(README.read_text())
    covered = statement.covers.split(" (post-processing")[0]
    assert _one_line(covered) in readme, f"README.md lacks, word for word:\n{covered}"
    for item in statement.does_not_cover:
        assert _one_line(_uncovered_head(item)) in readme, f"README.md does not name what epsilon leaves out:\n{item}"


def test_readme_is_a_short_page_with_the_two_fresh_machine_commands_as_they_are():
    text = README.read_text()
    words = len(text.split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words, more than {README_MAX_WORDS}"
    lines = text.splitlines()
    for command in (MAIN_JOB_COMMAND, TEST_COMMAND):
        assert command in lines, f"README.md lacks the command line, as it is:\n{command}"


def test_docs_index_lists_every_document():
    index = (DOCS / "README.md").read_text()
    missing = [page.name for page in DOCS.glob("*.md") if page.name != "README.md" and f"docs/{page.name}" not in index]
    assert not missing, f"docs/README.md does not list {missing}"


def _exists(path: str) -> bool:
    """Whether `path` names something in the repository; `<name>` and `*` stand for any one name."""
    path = path.rstrip(".,;")
    if "<" in path or "*" in path:
        return any(ROOT.glob(re.sub(r"<[^>]*>", "*", path).rstrip("/")))
    return (ROOT / path).exists()


def test_every_repository_path_the_documents_name_exists():
    missing = sorted(
        {
            f"{document.relative_to(ROOT)}: {path}"
            for document in _documents()
            for path in REPOSITORY_PATH.findall(document.read_text())
            if not _exists(path)
        }
    )
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_test_the_documents_name_exists():
    missing = sorted(
        {
            f"{document.name}: {path}::{name}"
            for document in _documents()
            for path, name in TEST_NODE.findall(document.read_text())
            if not (ROOT / path).is_file() or not re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.MULTILINE)
        }
    )
    assert not missing, "tests that do not exist:\n" + "\n".join(missing)


def _module_source(names: list[str]) -> Path | None:
    """The file of the module or package `names` (folders of the repository), or None."""
    base = ROOT.joinpath(*names)
    for source in (base.with_suffix(".py"), base / "__init__.py"):
        if source.is_file():
            return source
    return None


def _module_exists(dotted: str) -> bool:
    """A module or package of a layer, or a name its module defines or imports (`...config.load_profile`)."""
    names = dotted.split(".")
    if _module_source(names):
        return True
    parent = _module_source(names[:-1])
    return parent is not None and re.search(rf"\b{names[-1]}\b", parent.read_text()) is not None


def test_every_module_the_documents_name_exists():
    missing = set()
    for document in _documents():
        text = document.read_text()
        missing |= {
            f"{document.name}: dpsynth.{name}" for name in LAYER_MODULE.findall(text) if not _module_exists(name)
        }
        missing |= {
            f"{document.name}: bench.{name}"
            for name in BENCH_MODULE.findall(text)
            if not (ROOT / "bench" / f"{name}.py").is_file()
        }
    assert not missing, "modules that do not exist:\n" + "\n".join(sorted(missing))


def test_the_real_table_path_appears_only_as_the_data_argument_of_a_command():
    for document in _documents():
        text = document.read_text()
        uses = text.count("../shared/data/cardio_train.csv")
        assert uses == text.count(REAL_TABLE_ARGUMENT), (
            f"{document.relative_to(ROOT)} names the real table's path outside a command's --data argument"
        )


def _repository_text_files() -> list[Path]:
    """The repository's files: tracked ones, and new ones git does not ignore (not yet committed)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the repository's files cannot be listed")
    return [ROOT / name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def test_nothing_in_the_repository_refers_to_a_file_outside_it():
    offenders = []
    for path in _repository_text_files():
        raw = path.read_bytes()
        if b"\0" in raw:
            continue
        for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
            if OUTSIDE_FILES.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "references to files outside the repository:\n" + "\n".join(offenders)
