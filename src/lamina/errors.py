"""Exceptions shared by every layer.

`LaminaError` is raised for bad user input (a config field out of range, a
corpus that cannot be read, an id outside the vocabulary). It subclasses
`ValueError`, so callers that only know the standard library can still catch
it. The command line turns it into one line on stderr and exit status 2.

`LaminaWarning` is issued (``warnings.warn``) for input that is used with a loss the user
should hear about (a file skipped, a tokenizer not converted); the command line prints it as
one line on stderr, ``lamina VERB: warning: ...``.

`CheckFailed` is raised by `lamina.checks` when a module breaks an invariant;
its message says what is wrong and by how much.
"""

from __future__ import annotations


class LaminaError(ValueError):
    """Bad input: the message names the field or value at fault."""


class LaminaWarning(UserWarning):
    """Input used, but not all of it: the message names what was left out and why."""


class CheckFailed(Exception):
    """An invariant check failed; the message says what and how far off."""
