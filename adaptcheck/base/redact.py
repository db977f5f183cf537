"""Keep secrets on the machine: recognise secret-looking variable names, redact them, and
scrub secret values out of any text that leaves the process.

The rule for names (:func:`is_secret_name`), chosen to catch credentials without hiding
the configuration an engineer needs to read:

1. The name is upper-cased and split into words at every character that is not a letter
   or digit (``HF_TOKEN`` → ``HF``, ``TOKEN``). Matching whole words, not substrings, is
   what keeps ``TOKENIZERS_PARALLELISM`` (word ``TOKENIZERS``) and
   ``CUDA_VISIBLE_DEVICES`` readable.
2. A name is secret when one of its words is a *secret word* — ``TOKEN``, ``SECRET``,
   ``PASSWORD``, ``PASSWD``, ``PASS``, ``PSWD``, ``PWD``, ``KEY``, ``KEYS``, ``APIKEY``,
   ``AUTH``, ``OAUTH``, ``AUTHORIZATION``, ``CREDENTIAL(S)``, ``CRED``, ``CREDS``,
   ``COOKIE``, ``PASSPHRASE``, ``DSN``, ``SIGNATURE``, ``BEARER``, ``JWT`` — or ends with
   one of the long, unambiguous ones (``HFTOKEN``, ``MYAPIKEY``, ``DBPASSWORD``,
   ``AWSCREDS``).
3. Two short words are secret only as the *last* word of the name: ``PAT`` (personal
   access token: ``HF_HUB_PAT``, ``GITHUB_PAT``) and ``PW`` (``TORCH_PW``, ``DB_PW``). As
   a first or middle word they are usually a tool's prefix (Playwright's
   ``PW_TEST_HTML_REPORT_OPEN``), and a secret-named variable's value is scrubbed from all
   text, so a false positive there would blank out ordinary words like ``always``.
4. Exceptions, each a real false positive: the secret word is followed by a word that
   makes the value a measure or a location rather than the secret itself
   (``MAX_TOKEN_LEN``, ``HF_TOKEN_PATH``, ``DB_PASSWORD_FILE``); and the shell's own
   ``PWD`` / ``OLDPWD`` (current directory). Plural ``TOKENS`` is not a secret word
   (``MAX_NUM_BATCHED_TOKENS`` is a count).

Over-redaction costs a hidden value in a report; under-redaction leaks a credential — so
where in doubt the rule redacts (``PAD_TOKEN_ID`` is redacted, harmlessly).

The rule for credentials by shape (:func:`scrub_url_credentials`):

- A URL's user-info goes whole, whatever it holds: ``scheme://USERINFO@host`` →
  ``scheme://***REDACTED***@host`` (a token is often the user name alone:
  ``https://<token>@github.com``).
- Without a scheme (proxy variables are often written ``user:pw@proxy:3128``), user-info
  is a credential when it holds a ``:`` before the ``@``: ``USER:PASSWORD@host`` →
  ``***REDACTED***@host``. Without the ``:`` it is left alone, so ``git@github.com:org/repo``,
  ``alice@example.com`` and ``model@main`` stay readable. It must start the token (text
  start, white space, a quote, a bracket, ``=``, ``,``, ``;``, ``|`` or ``/``) and the
  ``@`` must be followed by a host name; ``mailto:alice@example.com`` and a container
  image digest (``image:1.0@sha256:…``) are not credentials.

:func:`scrub_text` is the last line of defence: it replaces the *values* of every
secret-named variable of the environment (length ≥ 6, so that ``1`` or ``true`` do not
wipe out unrelated text), the passwords found in user-info of *any* variable's value
(``HTTPS_PROXY=user:pw@proxy`` → the password alone is scrubbed too), credentials by
shape as above, and a few unmistakable token shapes (Hugging Face ``hf_…``, OpenAI
``sk-…``, GitHub ``ghp_…``, AWS ``AKIA…``, ``Bearer …`` headers) wherever they appear.
:func:`scrub_file` applies it to a file in place, and :func:`scrub_tree` to every file of
a run folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

REDACTED = "***REDACTED***"
"""What a secret value is replaced with."""

MIN_SCRUB_LENGTH = 6
"""Values shorter than this are not scrubbed from free text: they would match everywhere."""

_SECRET_WORDS = frozenset({
    "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASSWDS", "PASS", "PSWD",
    "PWD", "KEY", "KEYS", "APIKEY", "AUTH", "OAUTH", "AUTHORIZATION", "CREDENTIAL", "CREDENTIALS",
    "CRED", "CREDS", "COOKIE", "PASSPHRASE", "DSN", "SIGNATURE", "BEARER", "JWT",
})
# Secret only as the last word of a name (rule 3 of the module doc): short, and used as prefixes.
_SECRET_LAST_WORDS = frozenset({"PAT", "PW"})
# Long enough that a word ending with them is a secret too (HFTOKEN, DBPASSWORD, MYAPIKEY).
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "SECRETKEY",
                    "PRIVATEKEY", "CREDENTIALS", "CREDS", "PASSPHRASE")
# A secret word followed by one of these names a measure or a location, not the secret.
_NOT_SECRET_AFTER = frozenset({"LEN", "LENGTH", "COUNT", "NUM", "SIZE", "LIMIT", "PATH", "FILE",
                               "DIR", "TYPE"})
_SHELL_NAMES = frozenset({"PWD", "OLDPWD"})

_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@\"'<>]+)@")
# Scheme-less ``user:password@host`` (module doc). The look-behind makes the user start a
# token, which also keeps the scan linear on long runs of non-separator characters.
_SEPARATORS = "\\s\"'`<>()\\[\\]{},;=|/"
_BARE_USERINFO = re.compile(
    rf"(?<![^{_SEPARATORS}])"
    rf"(?P<user>[^{_SEPARATORS}@:]+):(?P<password>[^{_SEPARATORS}@]+)"
    r"@(?!sha\d+:)(?=[A-Za-z0-9\[])")
# ``mailto:alice@example.com`` is an address, not user:password.
_NOT_USERS = frozenset({"mailto"})
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
    if words and words[-1] in _SECRET_LAST_WORDS:
        return True
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
    """Replace credentials in URLs and ``user:pw@host`` forms (rule in the module doc).

    ``https://user:pass@host`` → ``https://***REDACTED***@host``; ``user:pw@proxy:3128`` →
    ``***REDACTED***@proxy:3128``. The whole user-info goes, not just the password: a token
    is often passed as the user name alone (``https://<token>@github.com``).
    """
    if "@" not in text:
        return text
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return _BARE_USERINFO.sub(_bare_replacement, text)


def _is_bare_credential(match: re.Match[str]) -> bool:
    """Whether a ``user:pw@host`` match is a credential (``mailto:alice@example.com`` is not)."""
    return match.group("user").lower() not in _NOT_USERS


def _bare_replacement(match: re.Match[str]) -> str:
    return f"{REDACTED}@" if _is_bare_credential(match) else match.group(0)


def userinfo_secrets(text: str) -> list[str]:
    """The credentials embedded in ``text`` by shape: each URL's whole user-info and the
    password of each ``user:pw@host`` (what :func:`scrub_url_credentials` would hide), so
    that they can be scrubbed by value where they appear on their own."""
    if "@" not in text:
        return []
    found: list[str] = []
    for m in _URL_USERINFO.finditer(text):
        userinfo = m.group("userinfo")
        found.append(userinfo)
        found.append(userinfo.partition(":")[2])
    found.extend(m.group("password") for m in _BARE_USERINFO.finditer(text) if _is_bare_credential(m))
    return [v for v in found if v and v != REDACTED]


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
    candidates: list[str] = []
    for name, value in env.items():
        if not value:
            continue
        if is_secret_name(name):
            candidates.append(value)
        # A credential inside any value (HTTPS_PROXY=user:pw@proxy) is a secret on its own too.
        candidates.extend(userinfo_secrets(value))
    for value in candidates:
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


def scrub_file(path: Path, environ: Mapping[str, str] | None = None) -> bool:
    """Scrub one file in place; True when it held a secret and was rewritten.

    Binary-safe: bytes that are not UTF-8 pass through unchanged (``surrogateescape``). The
    file is rewritten in place, not replaced, so its inode survives: a lock held on it (the
    run folder's ``run.lock``) or a process appending to it keeps working.
    """
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="surrogateescape")
    scrubbed = scrub_text(text, environ)
    if scrubbed == text:
        return False
    with open(path, "r+b") as fh:
        fh.write(scrubbed.encode("utf-8", errors="surrogateescape"))
        fh.truncate()
    return True


def scrub_tree(root: Path, environ: Mapping[str, str] | None = None) -> list[Path]:
    """Scrub every regular file under ``root`` in place (:func:`scrub_file`); the files rewritten.

    This is the one redaction for a run folder: files that the worker and its subprocesses
    write directly (``worker.log``, server logs, ``perf/*/*.jsonl``) never pass through the
    writers' own scrubbing. Symbolic links are not followed (they may point outside the
    folder); a file that cannot be read or written is left as it is (the run must still end
    with its results).
    """
    changed: list[Path] = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                if scrub_file(path, environ):
                    changed.append(path)
            except OSError:
                continue
    return changed
