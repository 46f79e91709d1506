"""The one exception type that the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user (a file, a folder, a value). The message names the culprit.

    The ``nnunet_dro`` command prints ``nnunet_dro <command>: error: <message>`` and exits with
    code 2, never a traceback. Library callers get the exception.
    """
