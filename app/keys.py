"""Remote endpoints' API keys in the OS keyring (the `keyring` package: Secret Service, macOS Keychain,
Windows Credential Locker). Where no keyring exists, the key stays in sluice.db in plain text, as before."""
from __future__ import annotations

import logging

SERVICE = "sluice-remote-endpoint"
log = logging.getLogger("sluice.keys")


def store(url: str, key: str) -> bool:
    """Put the key in the keyring; False where there is no usable keyring (the caller keeps it in sluice.db)."""
    try:
        import keyring
        keyring.set_password(SERVICE, url, key)
        return True
    except Exception as exc:          # noqa: BLE001 - no backend, a locked or refusing keyring: plain text instead
        log.info("no OS keyring for the API key of %s (%s); it stays in sluice.db", url, exc)
        return False


def load(url: str) -> str | None:
    try:
        import keyring
        return keyring.get_password(SERVICE, url)
    except Exception as exc:          # noqa: BLE001 - the keyring went away: the endpoint asks for its key again
        log.warning("the API key of %s cannot be read from the OS keyring (%s)", url, exc)
        return None
