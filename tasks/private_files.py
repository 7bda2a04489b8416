"""Owner-only files: everything dpsynth writes outside the published bundle holds real rows or facts
derived from them (the validated table, the encoded rows, the split, the critics, the internal MLflow
store and its artifacts, the privacy ledger), so it is created readable by its owner only, whatever the
umask of whoever started the process. The bundle is the one thing meant to be shared: it gets ordinary
shareable modes, and stays unreachable to others while it sits in its owner-only run folder.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

OWNER_ONLY_UMASK = 0o077
SHARED_DIR_MODE = 0o755
SHARED_FILE_MODE = 0o644


def owner_only() -> None:
    """Create every later file 0600 and folder 0700 in this process (and in the processes it starts,
    which inherit the umask). Called by the command line, by each flow and by each stage task, since a
    deployment or a Dask worker enters the code at a flow or a task, not at the command line."""
    os.umask(OWNER_ONLY_UMASK)


def restrict(path: Path) -> None:
    """Take group and other permissions off `path` (a file or a folder, not what a folder holds) when it
    exists and this user owns it: for stores made by an older dpsynth or another tool, with a looser umask."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)


def restrict_tree(root: Path) -> None:
    """`restrict` on a folder and everything in it: for copies that keep their source's modes (MLflow's
    local artifact store copies files with their permission bits)."""
    root = Path(root)
    if root.exists():
        for path in [root, *root.rglob("*")]:
            restrict(path)


def private_dir(path: Path) -> Path:
    """`path` as a folder (made with its parents if missing) readable by its owner only."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    restrict(path)
    return path


def make_shareable(folder: Path) -> None:
    """Ordinary modes for a folder meant to be published: folders 0755, files 0644."""
    folder = Path(folder)
    os.chmod(folder, SHARED_DIR_MODE)
    for path in folder.rglob("*"):
        os.chmod(path, SHARED_DIR_MODE if path.is_dir() else SHARED_FILE_MODE)
