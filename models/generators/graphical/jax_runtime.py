"""jax and `mbi` set up once for the generators that fit with private-pgm (MST, AIM).

jax runs with 64-bit floats (for the whole process: nothing else in dpsynth uses jax) and its persistent
compilation cache off while `mbi` loads (`mbi` warns on import while it is on: it compiles many small programs,
which a cache shared by many runs would pile up). The cache stays off unless a folder for it is named
(`JAX_COMPILATION_CACHE_DIR`, jax's own setting): the test suite names a fresh one per session (tests/conftest.py),
so that each fit of the session's many MST and AIM fits, in any of its processes, compiles only the programs no
earlier fit compiled (a stage's end drops the compiled programs from memory: tasks/memory.py). The programs are
built from what `mbi` is given (the noisy measurements, the domain, the total): a folder named for them should be
as private as a run folder.

`mbi` imports absl, whose log handler keeps the `sys.stderr` of the moment of import; a later
`logging.config.dictConfig` (Prefect's and MLflow's logging set-up) closes every handler, and absl's then
closes its stream unless it is the process's own stderr. A stderr redirected at that moment (the command
line's quiet console, a test's captured output) would be closed under its owner, so the handler is pointed
at the process's own stderr.
"""

from __future__ import annotations

import sys
from types import ModuleType


def load_jax() -> ModuleType:
    """jax, configured, with `mbi` imported and absl's handler on the process's stderr."""
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import mbi  # noqa: F401  (imports absl)

    _absl_on_process_stderr()
    if getattr(jax.config, "jax_compilation_cache_dir", None):  # named by who runs the process: module notes
        jax.config.update("jax_enable_compilation_cache", True)
    return jax


def _absl_on_process_stderr() -> None:
    try:
        from absl import logging as absl_logging
    except ImportError:  # a later mbi without absl
        return
    absl_logging.get_absl_handler().python_handler.setStream(sys.__stderr__)


def drop_compiled_programs() -> None:
    """Forget the programs jax has compiled (private-pgm's: hundreds of MB, kept for the life of the
    process); a later fit compiles what it needs again, to the same results."""
    import jax

    jax.clear_caches()
