"""Test-only adaptcheck plugin: a dummy backend and check kinds that pass, fail, raise, crash and hang."""
