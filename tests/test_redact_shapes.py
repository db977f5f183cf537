"""Redaction by name and by shape (issue 12): the new secret words, ``user:pw@host`` without a
scheme, credentials found inside any variable's value, in-place scrubbing of files and run
folders, and the ordinary values that must stay readable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adaptcheck.base.errors import UsageError
from adaptcheck.base.redact import (
    REDACTED,
    is_secret_name,
    redact_env,
    scrub_file,
    scrub_text,
    scrub_tree,
    scrub_url_credentials,
    secret_values,
)
from adaptcheck.session import resume_endpoint


@pytest.mark.parametrize("name", [
    "HF_HUB_PAT", "GITHUB_PAT", "TORCH_PW", "DB_PW", "VLLM_DB_CREDS", "AWS_CRED", "AWSCREDS", "SMTP_PSWD",
    "MY_PASSWDS", "PROXY_BEARER", "SERVICE_JWT", "hf-hub-pat",
])
def test_new_secret_words(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    # PAT and PW count only as the last word: elsewhere they are a tool's prefix.
    "PW_TEST_HTML_REPORT_OPEN", "PAT_FILE", "PWDEBUG", "PATH", "PATCH_LEVEL",
    "TOKENIZERS_PARALLELISM", "MAX_TOKEN_LEN", "VLLM_MAX_TOKEN_LEN", "SACRED", "CREDS_FILE", "HF_PAT_PATH",
])
def test_not_secret_names_around_the_new_words(name: str) -> None:
    assert not is_secret_name(name)


def test_redact_env_hides_the_new_words() -> None:
    env = {"HF_HUB_PAT": "hubPAT-planted-1", "TORCH_PW": "torchPW-planted-2", "VLLM_DB_CREDS": "dbCREDS-3",
           "TOKENIZERS_PARALLELISM": "false", "VLLM_MAX_TOKEN_LEN": "4096"}
    assert redact_env(env) == {"HF_HUB_PAT": REDACTED, "TORCH_PW": REDACTED, "VLLM_DB_CREDS": REDACTED,
                               "TOKENIZERS_PARALLELISM": "false", "VLLM_MAX_TOKEN_LEN": "4096"}


def test_values_of_the_new_words_are_scrubbed_from_free_text() -> None:
    env = {"HF_HUB_PAT": "hubPAT-planted-1", "TORCH_PW": "torchPW-planted-2", "VLLM_DB_CREDS": "dbCREDS-3"}
    out = scrub_text("a hubPAT-planted-1 b torchPW-planted-2 c dbCREDS-3 d", env)
    assert out == f"a {REDACTED} b {REDACTED} c {REDACTED} d"


@pytest.mark.parametrize("text, expected", [
    ("HTTPS_PROXY=user:pw@proxy:3128", f"HTTPS_PROXY={REDACTED}@proxy:3128"),
    ("user:pw@host", f"{REDACTED}@host"),
    ("--proxy alice:s3cr3t@10.0.0.1:8080 next", f"--proxy {REDACTED}@10.0.0.1:8080 next"),
    ('{"HF_HUB_PROXY":"u:p@proxy.example:3128","n":1}', f'{{"HF_HUB_PROXY":"{REDACTED}@proxy.example:3128","n":1}}'),
    ("(u:pa:ss@[::1]:3128)", f"({REDACTED}@[::1]:3128)"),
    ("x=//u:p@h/path", f"x=//{REDACTED}@h/path"),
])
def test_user_password_without_a_scheme(text: str, expected: str) -> None:
    assert scrub_url_credentials(text) == expected
    assert scrub_text(text, {}) == expected


@pytest.mark.parametrize("text", [
    "git@github.com:org/repo",                 # scp-style git: no ':' before the '@'
    "ssh git@github.com:org/repo.git",
    "alice@example.com",                       # an e-mail address
    "mailto:alice@example.com",                # a mailto: URI is an address, not user:password
    "http://127.0.0.1:8000/v1",                # a URL without credentials
    "https://host/path?user=me@example.com",
    "vllm/vllm-openai:v0.6.0@sha256:0123abcd",  # a container image pinned by digest
    "/models/tiny-llama@main",
    "a:b @host",                               # not one token
    "TOKENIZERS_PARALLELISM=false MAX_TOKEN_LEN=4096",
])
def test_ordinary_values_are_not_redacted(text: str) -> None:
    assert scrub_url_credentials(text) == text
    assert scrub_text(text, {"TOKENIZERS_PARALLELISM": "false", "MAX_TOKEN_LEN": "4096"}) == text


def test_url_credentials_anywhere_in_text() -> None:
    text = "cannot reach http://epuser:s3cr3tTOKEN@127.0.0.1:9/v1: refused; also ws://t0k3n@h/x"
    out = scrub_text(text, {})
    assert "s3cr3tTOKEN" not in out and "epuser" not in out and "t0k3n" not in out
    assert f"http://{REDACTED}@127.0.0.1:9/v1" in out and f"ws://{REDACTED}@h/x" in out


def test_password_of_a_proxy_variable_is_scrubbed_on_its_own() -> None:
    # HTTPS_PROXY is not a secret name, but the password inside it is a secret wherever it
    # appears, e.g. a library that logs the parsed proxy auth.
    env = {"HTTPS_PROXY": "proxyuser:pr0xyPW-66120@proxy.example:3128", "NO_PROXY": "localhost"}
    assert "pr0xyPW-66120" in secret_values(env)
    out = scrub_text("auth=('proxyuser', 'pr0xyPW-66120')", env)
    assert "pr0xyPW-66120" not in out
    # short passwords are not scrubbed by value (they would match everywhere), only by shape
    assert "pw" not in secret_values({"HTTPS_PROXY": "u:pw@proxy:3128"})


def test_scrubbing_is_idempotent() -> None:
    env = {"HF_HUB_PAT": "hubPAT-planted-1"}
    text = "x hubPAT-planted-1 http://u:p@h/v1 user:pw@proxy:3128 Bearer abcdefghijklmnop"
    once = scrub_text(text, env)
    assert scrub_text(once, env) == once


def test_scrub_file_in_place_keeps_binary_bytes_and_the_inode(tmp_path: Path) -> None:
    path = tmp_path / "worker.log"
    path.write_bytes(b"\xff\xfe\x00 binary \x80 then user:s3cretPW@proxy:3128 and TOKEN-VALUE-123\n")
    inode = path.stat().st_ino
    assert scrub_file(path, {"MY_TOKEN": "TOKEN-VALUE-123"})
    data = path.read_bytes()
    assert data == b"\xff\xfe\x00 binary \x80 then " + REDACTED.encode() + b"@proxy:3128 and " + REDACTED.encode() + b"\n"
    assert path.stat().st_ino == inode  # rewritten in place: a lock or an appender keeps working
    assert not scrub_file(path, {"MY_TOKEN": "TOKEN-VALUE-123"})  # nothing left to change


def test_scrub_tree_reaches_every_file_but_not_through_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("user:s3cretPW@proxy:3128")
    run = tmp_path / "run"
    (run / "perf" / "serving").mkdir(parents=True)
    (run / "perf" / "serving" / "a.jsonl").write_text('{"url": "http://u:s3cretPW@h/v1"}\n')
    (run / "worker.log").write_text("clean\n")
    os.symlink(outside, run / "link.txt")
    changed = scrub_tree(run, {})
    assert changed == [run / "perf" / "serving" / "a.jsonl"]
    assert "s3cretPW" not in (run / "perf" / "serving" / "a.jsonl").read_text()
    assert outside.read_text() == "user:s3cretPW@proxy:3128"  # a link's target is not ours to edit


STORED = f"http://{REDACTED}@127.0.0.1:9/v1"


def test_resume_endpoint_takes_the_url_again_when_it_had_credentials() -> None:
    assert resume_endpoint(STORED, "http://epuser:s3cr3t@127.0.0.1:9/v1") == "http://epuser:s3cr3t@127.0.0.1:9/v1"
    with pytest.raises(UsageError, match="had credentials"):
        resume_endpoint(STORED, None)
    with pytest.raises(UsageError, match="not this run's endpoint"):
        resume_endpoint(STORED, "http://epuser:s3cr3t@10.0.0.2:9/v1")


def test_resume_endpoint_without_credentials() -> None:
    assert resume_endpoint("http://127.0.0.1:8000/v1", None) == "http://127.0.0.1:8000/v1"
    assert resume_endpoint("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    assert resume_endpoint(None, None) is None
    with pytest.raises(UsageError, match="without an endpoint"):
        resume_endpoint(None, "http://127.0.0.1:8000/v1")
    with pytest.raises(UsageError) as info:
        resume_endpoint("http://127.0.0.1:8000/v1", "http://u:leaky-secret@127.0.0.1:8001/v1")
    assert "leaky-secret" not in str(info.value) and "leaky-secret" not in str(info.value.hint)
