"""Loading a results file that something is about to trust: verified first, or refused.

``grade``, ``report``, ``compare``, ``matrix merge``/``export-known-good`` and
``run --baseline`` all act on what a results.json says; each reads it through
:func:`load_verified`, so the rule is written once: a file whose digest does not match its
content (edited after the run) or that carries no digest (nothing proves it intact) is
refused with :class:`~adaptcheck.base.errors.IntegrityError` (exit 5) — unless the user passed
``--allow-unverified``, in which case it is returned with its :class:`VerifyResult` and the
caller marks its output as unverified (``VerifyResult.unverified_reason`` gives the words).
"""

from __future__ import annotations

from pathlib import Path

from adaptcheck.base.errors import IntegrityError, InvalidInputError
from adaptcheck.base.integrity import Integrity, VerifyResult, verify_file
from adaptcheck.base.schemas.results import RunResults

ALLOW_OPTION = "--allow-unverified"
ALLOW_HELP = ("Use a results file even when it was edited after its run or carries no digest; "
              "the output is then marked UNVERIFIED. Without it such a file is refused (exit 5).")

_HINTS = {
    Integrity.EDITED: ("use the results.json exactly as its run wrote it ('adaptcheck verify' checks it), "
                       f"or pass {ALLOW_OPTION} to use it anyway, marked unverified"),
    Integrity.NO_DIGEST: ("only files written by adaptcheck with results schema 1.1 or later carry one; "
                          f"pass {ALLOW_OPTION} to use it anyway, marked unverified"),
}


def require_verified(check: VerifyResult, allow_unverified: bool, role: str = "") -> VerifyResult:
    """Raise unless ``check`` is intact or the caller allows unverified files.

    ``role`` prefixes the message (e.g. ``"--baseline: "``) when the path alone does not
    say which input is meant. An unreadable file is an InvalidInputError (exit 3) whatever
    ``allow_unverified`` says: there is nothing to use.
    """
    if check.status is Integrity.UNREADABLE:
        raise InvalidInputError(f"{role}{check.message}", hint="pass the results.json of a run")
    if not check.intact and not allow_unverified:
        raise IntegrityError(f"{role}{check.message}", hint=_HINTS.get(check.status))
    return check


def load_verified(path: Path, allow_unverified: bool, role: str = "") -> tuple[RunResults, VerifyResult]:
    """The results in ``path`` and what its digest says of them.

    Loads first (a file that is not valid results is an InvalidInputError, exit 3, with the
    loader's own message and its size/depth limits), then verifies the digest: edited or
    undigested → IntegrityError (exit 5) unless ``allow_unverified``.
    """
    results = RunResults.load(path)
    return results, require_verified(verify_file(path), allow_unverified, role)


__all__ = ["ALLOW_HELP", "ALLOW_OPTION", "load_verified", "require_verified"]
