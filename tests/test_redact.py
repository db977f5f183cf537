"""Secrets never leave the machine: names, false positives, text scrubbing, URL credentials."""

from __future__ import annotations

import json

import pytest

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.redact import (
    REDACTED,
    is_secret_name,
    redact_env,
    scrub_text,
    scrub_url_credentials,
)
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.steps.matrix.capture import capture_environment


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "DB_PASSWORD", "MYSQL_PWD", "SMTP_PASS", "GITHUB_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CLIENT_SECRET", "SENTRY_DSN", "HFTOKEN", "my_apikey",
    "api-key", "Authorization", "NGC_API_KEY", "WANDB_API_KEY", "SSH_PRIVATE_KEY", "COOKIE",
])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "VLLM_MAX_NUM_BATCHED_TOKENS", "PWD", "OLDPWD",
    "HF_TOKEN_PATH", "DB_PASSWORD_FILE", "VLLM_MAX_TOKEN_LEN", "PATH", "LD_LIBRARY_PATH", "HF_HOME",
    "NCCL_DEBUG", "OMP_NUM_THREADS", "VLLM_PLUGINS", "MONKEYPATCH", "KEYBOARD", "PASSTHROUGH", "AUTHOR",
    "TRANSFORMERS_CACHE", "VLLM_CPU_KVCACHE_SPACE",
])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_redact_env_replaces_secret_values_and_url_credentials() -> None:
    out = redact_env({"HF_TOKEN": "hf_x", "CUDA_VISIBLE_DEVICES": "0,1",
                      "HF_ENDPOINT": "https://alice:s3cr3t@mirror.example/hf"})
    assert out == {"HF_TOKEN": REDACTED, "CUDA_VISIBLE_DEVICES": "0,1",
                   "HF_ENDPOINT": f"https://{REDACTED}@mirror.example/hf"}


def test_scrub_text_removes_secret_values_everywhere() -> None:
    environ = {"MY_SERVICE_TOKEN": "tok-123456789", "SHORT_KEY": "abc", "CUDA_HOME": "/usr/local/cuda"}
    text = "header tok-123456789 middle\n{'x': 'tok-123456789'} abc /usr/local/cuda"
    out = scrub_text(text, environ)
    assert "tok-123456789" not in out
    assert out.count(REDACTED) == 2
    # too short to scrub safely, and non-secret values stay readable
    assert "abc" in out and "/usr/local/cuda" in out


def test_scrub_text_catches_json_escaped_values() -> None:
    secret = 'pa"ss\\word-42'
    environ = {"DB_PASSWORD": secret}
    doc = json.dumps({"note": f"connect with {secret}"})
    assert secret not in doc  # it is escaped in JSON …
    out = scrub_text(doc, environ)
    assert json.dumps(secret)[1:-1] not in out  # … and the escaped form is scrubbed too
    assert REDACTED in json.loads(out)["note"]


def test_scrub_text_uses_os_environ_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATE_SECRET", "set-after-import-9876")
    assert scrub_text("value: set-after-import-9876") == f"value: {REDACTED}"


@pytest.mark.parametrize("url, expected", [
    ("https://user:pass@host/x", f"https://{REDACTED}@host/x"),
    ("git+https://ghp_token@github.com/o/r.git", f"git+https://{REDACTED}@github.com/o/r.git"),
    ("see http://a:b@h:8080/p and ftp://u:p@f/", f"see http://{REDACTED}@h:8080/p and ftp://{REDACTED}@f/"),
    ("https://host/path?user=me@example.com", "https://host/path?user=me@example.com"),
    ("mail alice@example.com", "mail alice@example.com"),
])
def test_url_credentials(url: str, expected: str) -> None:
    assert scrub_url_credentials(url) == expected


def test_token_shapes_are_scrubbed_without_an_environment() -> None:
    text = ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 sk-proj-abcdefghijklmnopqrstuvwx "
            "AKIAABCDEFGHIJKLMNOP Authorization: Bearer abc.def.ghijklmnop")
    out = scrub_text(text, {})
    for leaked in ("hf_AbCd", "sk-proj", "AKIAABCD", "abc.def.ghijklmnop"):
        assert leaked not in out


def test_secret_in_environment_never_reaches_captured_json(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hunter2-very-secret-value"
    monkeypatch.setenv("HF_TOKEN", secret)                     # captured name (HF_ prefix) → redacted
    monkeypatch.setenv("OPENAI_API_KEY", secret + "-b")       # not a captured prefix at all
    monkeypatch.setenv("VLLM_EXTRA_ARGS", f"--api-key {secret}")  # secret value inside a captured non-secret
    monkeypatch.setenv("HF_ENDPOINT", "https://bob:pw-123456@mirror.example")
    env = capture_environment(CpuBackend(), ModelSpec(name=f"/models/{secret}"))
    dumped = env.model_dump_json()
    assert secret not in dumped
    assert "pw-123456" not in dumped
    assert env.env_vars["HF_TOKEN"] == REDACTED
    assert env.env_vars["VLLM_EXTRA_ARGS"] == f"--api-key {REDACTED}"
    assert env.env_vars["HF_ENDPOINT"] == f"https://{REDACTED}@mirror.example"
    assert "OPENAI_API_KEY" not in env.env_vars
