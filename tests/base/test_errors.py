"""base.errors: one line per exception, never an empty one ("ImportError:" with nothing after the
colon was a real message of README command 1, issue 39), and a missing optional package named
with the pip command that installs it."""

from __future__ import annotations

import pytest

from adaptcheck.base.errors import exception_line, missing_dependency

# transformers 5.19's own text (requires_backends → AutoImageProcessor without Pillow): it opens
# with a newline, which the old ``str(exc).splitlines()[0]`` turned into an empty message.
PIL_MISSING = ("\nAutoImageProcessor requires the PIL library but it was not found in your environment. You can "
               "install it with pip:\n`pip install pillow`. Please note that you may need to restart your runtime "
               "after installation.\n")


def test_a_message_that_opens_with_a_newline_keeps_its_text() -> None:
    line = exception_line(ImportError(PIL_MISSING))
    assert line.startswith("ImportError: AutoImageProcessor requires the PIL library"), line
    assert exception_line(ImportError(PIL_MISSING), with_type=False).startswith("AutoImageProcessor")


def test_an_exception_without_text_says_its_cause() -> None:
    try:
        try:
            raise ImportError(PIL_MISSING)
        except ImportError as inner:
            raise RuntimeError() from inner
    except RuntimeError as outer:
        line = exception_line(outer)
    assert line.startswith("RuntimeError: ImportError: AutoImageProcessor requires"), line
    assert exception_line(ModuleNotFoundError(name="cv2")) == "ModuleNotFoundError: No module named 'cv2'"
    assert exception_line(ValueError()) == "ValueError"  # nothing anywhere: the type, never "ValueError: "


@pytest.mark.parametrize(("exc", "want"), [
    (ImportError(PIL_MISSING), "AutoImageProcessor requires the PIL library but it was not found in your "
                               "environment (pip install pillow)"),
    (ModuleNotFoundError("No module named 'PIL'", name="PIL"), "the optional package 'PIL' is not installed "
                                                               "(pip install pillow)"),
    (ModuleNotFoundError("No module named 'nopkg_x.layers'", name="nopkg_x.layers"),
     "the optional package 'nopkg_x' is not installed (pip install nopkg_x)"),
])
def test_a_missing_package_is_named_with_its_pip_command(exc: BaseException, want: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptcheck.base import errors

    # Pillow is installed here (vLLM needs it): read the venv as one without it.
    monkeypatch.setattr(errors, "module_present", lambda module: module not in {"PIL", "nopkg_x"})
    assert missing_dependency(exc) == want
    try:
        raise RuntimeError("transformers could not load the model") from exc
    except RuntimeError as wrapped:  # found through the chain as the loaders raise it
        assert missing_dependency(wrapped) == want


def test_other_failures_are_not_a_missing_package() -> None:
    assert missing_dependency(ValueError("pip install is not the point here")) is None
    assert missing_dependency(ImportError("cannot import name 'x' from 'y'")) is None
    assert missing_dependency(RuntimeError("CUDA error: illegal memory access")) is None
    # An installed package missing a part of itself (vLLM without its compiled ops) is a broken
    # install, a defect to report: never "optional, not installed".
    assert missing_dependency(ModuleNotFoundError("No module named 'torch._nope'", name="torch._nope")) is None
