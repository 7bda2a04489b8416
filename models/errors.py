"""The few errors a user can cause. The command line turns each into a message and an exit status."""


class DpsynthError(Exception):
    """Base class: the message is shown to the user as it is, without a traceback."""

    exit_code = 1


class ConfigError(DpsynthError):
    """A schema or profile file is missing or malformed."""

    exit_code = 2


class MissingInputError(DpsynthError):
    """An input file or a required earlier stage output does not exist."""

    exit_code = 3


class InvalidTableError(DpsynthError):
    """The input table does not conform to its schema.

    `problems` lists (column, rule, rows) triples for a readable report; it never holds raw values.
    """

    exit_code = 4

    def __init__(self, message: str, problems: list[tuple[str, str, int]] | None = None):
        self.problems = list(problems or [])
        if self.problems:
            lines = [f"  - column {col!r}: {rule} ({rows} rows)" for col, rule, rows in self.problems]
            message = message + "\n" + "\n".join(lines)
        super().__init__(message)


class BudgetExceededError(DpsynthError):
    """Nothing can be released within the configured privacy budget."""

    exit_code = 5


class ReleaseNotApprovedError(DpsynthError):
    """The chosen generator does not meet the profile's approval rule (e.g. its minimum AUC)."""

    exit_code = 6


class StorageError(DpsynthError):
    """An internal file could not be written or read back intact (permissions, a full disk, a damaged
    checkpoint) or the tracking store cannot be reached. Completed work is kept; a rerun resumes."""

    exit_code = 7


class RunInProgressError(DpsynthError):
    """Another process is running the same run (the same folder) now: two processes must never run one
    run's stages at once. Nothing was done; the same command after it ends reuses or resumes that run."""

    exit_code = 9
