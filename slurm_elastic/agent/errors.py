"""Errors of the node agent and of the controller's agent client, all under :class:`SlurmElasticError`."""

from __future__ import annotations

from slurm_elastic.errors import ConfigError, SlurmElasticError


class AgentError(SlurmElasticError):
    """Base of the node agent's errors."""


class NvmlUnavailableError(AgentError):
    """NVML cannot be initialised: library missing, driver not loaded, no permission. Stops start-up unless the
    agent is configured to run degraded (reporting no GPUs)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # stable code, e.g. "library_not_found", "driver_not_loaded"


class NvmlReadError(AgentError):
    """A whole sample failed (e.g. the device count could not be read); the reader is re-opened next time."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NvmlTimeoutError(AgentError):
    """An NVML call did not return within the configured time."""


class NvmlBusyError(AgentError):
    """An earlier NVML call is still blocked; no new call is started until it returns."""


class KeyFileError(ConfigError):
    """The agent's shared key file is missing, unreadable, too short or readable by others."""


class AuthError(AgentError):
    """A request failed authentication. ``reason`` is a stable code sent back with the 401."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PayloadError(SlurmElasticError):
    """An agent payload does not match the schema. ``path`` names the offending field, e.g. ``gpus[2].uuid``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class AgentClientError(SlurmElasticError):
    """Base of the failures of fetching one agent; ``url`` is the agent's base URL."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url


class AgentUnreachableError(AgentClientError):
    """Connection refused, host unknown, connection reset."""


class AgentTimeoutError(AgentClientError):
    """The agent did not answer in time."""


class AgentAuthError(AgentClientError):
    """The agent refused our credentials (401), or its answer was not signed with the shared key."""


class AgentHttpError(AgentClientError):
    """Any other unexpected HTTP status."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(url, f"HTTP {status}: {message}")
        self.status = status


class AgentPayloadError(AgentClientError):
    """The answer is not valid JSON, or does not match the payload schema."""


class AgentRequestError(AgentHttpError):
    """The agent refused or failed a request and said why in a signed JSON answer (``error`` is its code)."""

    def __init__(self, url: str, status: int, error: str, message: str, changes: tuple[str, ...] = ()) -> None:
        super().__init__(url, status, f"{error}: {message}")
        self.error = error
        self.detail = message
        self.changes = changes
