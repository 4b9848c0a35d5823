"""The controller's local API: a UNIX socket that knows who is calling (SO_PEERCRED), so authorization cannot be
bypassed by a user's own client. See docs/operating.md."""
