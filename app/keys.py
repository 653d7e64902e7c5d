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


def forget(url: str) -> None:
    """Delete the endpoint's key from the keyring (its endpoint was removed or replaced)."""
    try:
        import keyring
        keyring.delete_password(SERVICE, url)
    except Exception as exc:          # noqa: BLE001 - no keyring, or no key there (it was in sluice.db): none to delete
        log.info("no API key of %s to delete from the OS keyring (%s)", url, exc)


def load(url: str) -> str | None:
    try:
        import keyring
        return keyring.get_password(SERVICE, url)
    except Exception as exc:          # noqa: BLE001 - the keyring went away: the endpoint asks for its key again
        log.warning("the API key of %s cannot be read from the OS keyring (%s)", url, exc)
        return None
