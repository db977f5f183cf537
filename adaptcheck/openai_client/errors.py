"""The client's one exception family: every transport or protocol failure as an :class:`EndpointError`
with a one-line, scrubbed message.
"""

from __future__ import annotations

from adaptcheck.base.errors import DeviceError, FrameworkError
from adaptcheck.base.redact import scrub_text


class EndpointError(DeviceError, FrameworkError):
    """An OpenAI-compatible endpoint could not answer; the message is one line.

    A :class:`~adaptcheck.base.errors.DeviceError` (exit code 4): the endpoint is the system
    under test, like a device that cannot be used. Also a
    :class:`~adaptcheck.frameworks.base.FrameworkError`, so adapters and checks that catch
    framework failures catch these too.
    """

    def __init__(self, message: str, *, url: str | None = None, hint: str | None = None) -> None:
        super().__init__(scrub_text(message), hint=scrub_text(hint) if hint else None)
        self.url = url


class EndpointUnreachable(EndpointError):
    """No connection could be made (refused, unknown host, connect timeout, bad URL)."""


class EndpointTimeout(EndpointError):
    """Connected, but the server did not answer (or went silent mid-stream) in time."""


class EndpointStatusError(EndpointError):
    """The server answered with an error: an HTTP error status, or an error event in a stream."""

    def __init__(self, message: str, *, status: int | None, server_message: str, url: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, url=url, hint=hint)
        self.status = status
        self.server_message = scrub_text(server_message)


class EndpointProtocolError(EndpointError):
    """The answer is not what the protocol says: bad JSON, a stream cut short, a dropped connection."""


class EndpointNotReady(EndpointError):
    """:meth:`AsyncOpenAIClient.wait_ready` gave up: not ready in time, or the server process died."""

    def __init__(self, message: str, *, process_exited: bool, url: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, url=url, hint=hint)
        self.process_exited = process_exited
