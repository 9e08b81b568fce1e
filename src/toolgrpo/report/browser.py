"""How the report page is opened headless (its browser test, the README's screenshot): Debian's
chromium, run as root on a machine whose network is closed."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
# No sandbox (root), and none of Chromium's background connections, which a closed network refuses.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
