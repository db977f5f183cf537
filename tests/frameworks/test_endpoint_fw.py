"""endpoint_fw: what a load generator reads of an HTTP-serving framework, as one typed value
(:func:`served_endpoint`); no server is started here."""

from __future__ import annotations

from pathlib import Path

from adaptcheck.frameworks.base import FrameworkConfig
from adaptcheck.frameworks.endpoint_fw import (
    EndpointFramework,
    ServedEndpoint,
    TransformersServeFramework,
    served_endpoint,
)
from adaptcheck.frameworks.server import ManagedServer, ServerSpec
from adaptcheck.frameworks.transformers_fw import TransformersFramework
from adaptcheck.openai_client.sync import OpenAIClient


def _loaded(fw: EndpointFramework, url: str, model: str | None) -> EndpointFramework:
    """``fw`` as ``load`` leaves it (a client and its URL), without a server to talk to."""
    fw.client = OpenAIClient(url, model=model)
    fw.url = fw.client.base_url
    return fw


def test_an_in_process_framework_and_an_unloaded_endpoint_serve_nothing() -> None:
    assert served_endpoint(TransformersFramework()) is None
    assert served_endpoint(EndpointFramework(FrameworkConfig(endpoint_url="http://10.0.0.7:8000"))) is None


def test_a_users_endpoint() -> None:
    fw = _loaded(EndpointFramework(), "http://10.0.0.7:8000", "served-name")
    assert fw.client is not None
    fw.client.aio.rejected_fields.add("ignore_eos")  # what the capability probe found
    ep = served_endpoint(fw)
    assert ep == ServedEndpoint(url="http://10.0.0.7:8000/v1", model="served-name",
                                rejected_fields=frozenset({"ignore_eos"}), launched=False, launched_pid=None)
    assert not ep.on_this_host  # another machine: no host telemetry, no local pid
    fw.client.aio.rejected_fields.add("top_k")
    assert ep.rejected_fields == {"ignore_eos"}  # a snapshot, not the client's live set


def test_a_users_endpoint_on_loopback_is_on_this_host() -> None:
    for url in ("http://127.0.0.1:8000", "http://localhost:8000/v1", "http://[::1]:8000"):
        ep = served_endpoint(_loaded(EndpointFramework(), url, None))
        assert ep is not None and ep.on_this_host and ep.model is None and not ep.launched, url
    ep = served_endpoint(_loaded(EndpointFramework(), "http://127.example.com:8000", None))
    assert ep is not None and not ep.on_this_host


def test_a_launched_server_is_on_this_host_with_its_pid(tmp_path: Path) -> None:
    fw = _loaded(TransformersServeFramework(), "http://127.0.0.1:9", "m")
    fw.server = ManagedServer(ServerSpec("transformers", tmp_path), tmp_path)  # never started
    ep = served_endpoint(fw)
    assert ep is not None and ep.launched and ep.launched_pid is None and ep.on_this_host
    fw.server._server_pid = 4242  # what start() found: the server, not its reaper
    ep = served_endpoint(fw)
    assert ep is not None and ep.launched_pid == 4242
