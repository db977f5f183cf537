"""Keep secrets on the machine: recognise secret-looking variable names, redact them, and
scrub secret values out of any text that leaves the process.

The rule for names (:func:`is_secret_name`), chosen to catch credentials without hiding
the configuration an engineer needs to read:

1. The name is upper-cased and split into words at every character that is not a letter
   or digit (``HF_TOKEN`` → ``HF``, ``TOKEN``). Matching whole words, not substrings, is
   what keeps ``TOKENIZERS_PARALLELISM`` (word ``TOKENIZERS``) and
   ``CUDA_VISIBLE_DEVICES`` readable.
2. A name is secret when one of its words is a *secret word* — ``TOKEN``, ``SECRET``,
   ``PASSWORD``, ``PASSWD``, ``PASS``, ``PWD``, ``KEY``, ``KEYS``, ``APIKEY``, ``AUTH``,
   ``OAUTH``, ``AUTHORIZATION``, ``CREDENTIAL(S)``, ``COOKIE``, ``PASSPHRASE``, ``DSN``,
   ``SIGNATURE`` — or ends with one of the long, unambiguous ones (``HFTOKEN``,
   ``MYAPIKEY``, ``DBPASSWORD``).
3. Exceptions, each a real false positive: the secret word is followed by a word that
   makes the value a measure or a location rather than the secret itself
   (``MAX_TOKEN_LEN``, ``HF_TOKEN_PATH``, ``DB_PASSWORD_FILE``); and the shell's own
   ``PWD`` / ``OLDPWD`` (current directory). Plural ``TOKENS`` is not a secret word
   (``MAX_NUM_BATCHED_TOKENS`` is a count).

Over-redaction costs a hidden value in a report; under-redaction leaks a credential — so
where in doubt the rule redacts (``PAD_TOKEN_ID`` is redacted, harmlessly).

:func:`scrub_text` is the last line of defence: it replaces the *values* of every
secret-named variable of the environment (length ≥ 6, so that ``1`` or ``true`` do not
wipe out unrelated text), credentials embedded in URLs (``https://user:pass@host``), and a
few unmistakable token shapes (Hugging Face ``hf_…``, OpenAI ``sk-…``, GitHub ``ghp_…``,
AWS ``AKIA…``, ``Bearer …`` headers) wherever they appear.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

REDACTED = "***REDACTED***"
"""What a secret value is replaced with."""

MIN_SCRUB_LENGTH = 6
"""Values shorter than this are not scrubbed from free text: they would match everywhere."""

_SECRET_WORDS = frozenset({
    "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS", "PWD",
    "KEY", "KEYS", "APIKEY", "AUTH", "OAUTH", "AUTHORIZATION", "CREDENTIAL", "CREDENTIALS",
    "COOKIE", "PASSPHRASE", "DSN", "SIGNATURE",
})
# Long enough that a word ending with them is a secret too (HFTOKEN, DBPASSWORD, MYAPIKEY).
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "SECRETKEY",
                    "PRIVATEKEY", "CREDENTIALS", "PASSPHRASE")
# A secret word followed by one of these names a measure or a location, not the secret.
_NOT_SECRET_AFTER = frozenset({"LEN", "LENGTH", "COUNT", "NUM", "SIZE", "LIMIT", "PATH", "FILE",
                               "DIR", "TYPE"})
_SHELL_NAMES = frozenset({"PWD", "OLDPWD"})

_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@\"'<>]+)@")
_TOKEN_SHAPES = (
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),                 # Hugging Face access token
    re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}"),                # OpenAI-style API key
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),          # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{30,}\b"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),                    # AWS access key id
    re.compile(r"(?i)(?<=\bbearer )[A-Za-z0-9._~+/\-]{12,}=*"),  # Authorization: Bearer …
)


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like it holds a credential (see module doc)."""
    if name.upper() in _SHELL_NAMES:
        return False
    words = _words(name)
    for i, word in enumerate(words):
        hit = word in _SECRET_WORDS or (len(word) > 4 and word.endswith(_SECRET_SUFFIXES))
        if not hit:
            continue
        following = words[i + 1] if i + 1 < len(words) else None
        if following in _NOT_SECRET_AFTER:
            continue
        return True
    return False


def scrub_url_credentials(text: str) -> str:
    """Replace the user-info part of URLs (``https://user:pass@host`` → ``https://***REDACTED***@host``).

    The whole user-info goes, not just the password: a token is often passed as the user
    name alone (``https://<token>@github.com``).
    """
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact_env(mapping: Mapping[str, str]) -> dict[str, str]:
    """Copy of ``mapping`` with secret-named values replaced and URL credentials scrubbed from the rest."""
    out: dict[str, str] = {}
    for name, value in mapping.items():
        out[name] = REDACTED if is_secret_name(name) else scrub_url_credentials(str(value))
    return out


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-named variables worth scrubbing, longest first (so overlaps go whole)."""
    env = os.environ if environ is None else environ
    values: set[str] = set()
    for name, value in env.items():
        if not is_secret_name(name) or not value:
            continue
        for variant in (value, value.strip()):
            if len(variant) >= MIN_SCRUB_LENGTH:
                values.add(variant)
                # The same value inside a JSON document is escaped ("\\", "\"", "\n" …).
                escaped = json.dumps(variant)[1:-1]
                if escaped != variant:
                    values.add(escaped)
    return sorted(values, key=len, reverse=True)


def scrub_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Remove every secret this process knows of from ``text``.

    ``environ`` defaults to ``os.environ`` *at call time* (a default bound at import would
    miss variables set later).
    """
    if not text:
        return text
    for value in secret_values(environ):
        if value in text:
            text = text.replace(value, REDACTED)
    text = scrub_url_credentials(text)
    for pattern in _TOKEN_SHAPES:
        text = pattern.sub(REDACTED, text)
    return text
