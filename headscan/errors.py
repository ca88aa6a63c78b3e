"""headscan's exceptions: one base class, one subclass per kind of user mistake.

Each message names what was asked for (model, file, line, setting) and how to fix it; the CLI turns any
`HeadscanError` into one `click.ClickException` line, so none of these ever reach a user as a traceback.
"""


class HeadscanError(Exception):
    """Something the user can fix: the message says what and how."""


class ModelNotFoundError(HeadscanError):
    """The model spec is neither an embedded alias, a local checkpoint, nor available from Hugging Face."""


class ModelLoadError(HeadscanError):
    """The model was found but could not be loaded or hooked."""


class CorpusError(HeadscanError):
    """The corpus is missing, empty, or malformed (the message names the file and line)."""


class ConfigError(HeadscanError):
    """A setting has a value outside its allowed range or choices.

    `setting` names it as the library spells it (``max_len``), and the message starts with that name, so the
    command line can say ``--max-len`` instead.
    """

    def __init__(self, message: str, *, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


class MetricError(HeadscanError):
    """An unknown metric name, or a metric registered twice."""


class SweepInterrupted(HeadscanError):
    """The sweep was stopped (Ctrl-C, SIGTERM); what was done is saved and the same command resumes it."""


class TablesError(HeadscanError):
    """A sweep output folder is missing, incomplete, or not written by headscan."""
