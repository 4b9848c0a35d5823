"""SE-MUNGE: the agent's verifier and the controller's side, over credentials and munged verdicts recorded from the
test cluster's munged (tests/fixtures/munge/, scripts/record-munge-replies); no munged is asked here."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from slurm_elastic.agent.auth import HEADER_SIGNATURE, sign_request
from slurm_elastic.agent.client import AgentClient, client_auth
from slurm_elastic.agent.config import load_config
from slurm_elastic.agent.errors import AgentAuthError, AuthError
from slurm_elastic.agent.metrics import AgentCounters
from slurm_elastic.agent.munge import Decoded, MungeError
from slurm_elastic.agent.munge_auth import (
    SCHEME,
    MungeClientAuth,
    MungeRequestVerifier,
    request_id,
    resolve_uid,
)
from slurm_elastic.agent.payload import NODE_PATH, NodeReport
from slurm_elastic.agent.server import AgentApp
from slurm_elastic.controller.config import load_controller_config
from slurm_elastic.errors import ConfigError
from slurm_elastic.keyschema import AGENT_KEY_FILE

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "munge" / "recorded.json"
CASES: dict[str, dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]
ROOT_UID, NOBODY_UID = 0, 65534


class RecordedMunge:
    """munged as recorded: each credential decodes to its recorded verdict; encode hands out the recorded
    credential made for that payload (and nothing else)."""

    def __init__(self) -> None:
        self.decodes = 0

    def decode(self, credential: str) -> Decoded:
        self.decodes += 1
        case = next((c for c in CASES.values() if c["credential"] == credential), None)
        if case is None:
            raise AssertionError("a credential that was not recorded reached munged")
        if "error" in case:
            raise MungeError(case["error"]["status"], case["error"]["message"])
        d = case["decoded"]
        return Decoded(d["status"], d["uid"], d["gid"], base64.b64decode(d["payload"]), d["encode_time"], d["ttl"])

    def encode(self, payload: bytes, ttl_s: int) -> str:
        for case in CASES.values():
            if "decoded" in case and base64.b64decode(case["decoded"]["payload"]) == payload \
                    and case["decoded"]["status"] == 0:
                return str(case["credential"])
        raise MungeError(0, "no recorded credential for this payload")


def header(name: str) -> dict[str, str]:
    return {"Authorization": f"{SCHEME} {CASES[name]['credential']}"}


def request_of(name: str) -> tuple[str, str, bytes]:
    r = CASES[name]["request"]
    return r["method"], r["path"], base64.b64decode(r["body"])


def at(name: str) -> float:
    return float(CASES[name]["decoded_at"])


def verifier(**kw: Any) -> MungeRequestVerifier:
    return MungeRequestVerifier(RecordedMunge(), kw.pop("controller_uid", ROOT_UID), **kw)


def reason(v: MungeRequestVerifier, name: str, *, request: tuple[str, str, bytes] | None = None,
           headers: dict[str, str] | None = None, now: float | None = None) -> str:
    method, path, body = request or request_of(name)
    with pytest.raises(AuthError) as info:
        v.verify(method, path, header(name) if headers is None else headers, body, at(name) if now is None else now)
    return info.value.reason


# ---- the verifier -----------------------------------------------------------------------------------------------


def test_a_credential_for_this_request_from_the_controller_user_is_accepted_once() -> None:
    v = verifier()
    for name in ("node_get", "mig_apply"):
        method, path, body = request_of(name)
        assert v.verify(method, path, header(name), body, at(name)) == request_id(CASES[name]["credential"])
        assert reason(v, name) == "replayed_credential"  # the agent's own cache, whatever munged says


def test_the_credential_is_bound_to_method_path_and_body() -> None:
    method, path, body = request_of("mig_apply")
    lifted = {
        "other body": (method, path, body + b" "),
        "other path": (method, "/v1/node", body),
        "other method": ("PUT", path, body),
        "query added": (method, path + "?x=1", body),
    }
    v = verifier()
    for what, request in lifted.items():
        assert reason(v, "mig_apply", request=request) == "request_mismatch", what
    assert reason(v, "node_get", request=request_of("mig_apply")) == "request_mismatch"
    v.verify(method, path, header("mig_apply"), body, at("mig_apply"))  # refusals did not use it up


def test_munged_verdicts_are_refused_with_their_reason() -> None:
    v = verifier()
    assert reason(v, "replayed_at_munged") == "replayed_credential"
    assert reason(v, "expired") == "expired_credential"
    assert reason(v, "tampered") == "bad_credential"
    assert reason(v, "other_key") == "bad_credential"


def test_only_the_controller_user_and_a_bounded_ttl_pass() -> None:
    assert reason(verifier(), "other_user") == "wrong_user"
    assert reason(verifier(controller_uid=NOBODY_UID), "node_get") == "wrong_user"
    method, path, body = request_of("other_user")
    verifier(controller_uid=NOBODY_UID).verify(method, path, header("other_user"), body, at("other_user"))
    assert reason(verifier(), "long_ttl") == "ttl_too_long"
    verifier(max_ttl_s=3600).verify(*request_of("long_ttl")[:2], header("long_ttl"), b"", at("long_ttl"))


def test_the_ttl_holds_on_the_agent_clock_too() -> None:
    encoded = CASES["node_get"]["decoded"]["encode_time"]
    assert reason(verifier(max_skew_s=5), "node_get", now=encoded + 60 + 6) == "expired_credential"
    assert reason(verifier(max_skew_s=5), "node_get", now=encoded - 6) == "rewound_credential"
    verifier(max_skew_s=5).verify(*request_of("node_get")[:2], header("node_get"), b"", encoded + 60 + 4)


def test_missing_and_malformed_headers_never_reach_munged() -> None:
    munge = RecordedMunge()
    v = MungeRequestVerifier(munge, ROOT_UID)
    hmac = sign_request(b"k" * 48, "GET", NODE_PATH, b"", now=at("node_get"))
    cred = CASES["node_get"]["credential"]
    cases = {
        "missing_credentials": {},
        "malformed_credentials": hmac,
    }
    for expected, headers in cases.items():
        assert reason(v, "node_get", headers=headers) == expected
    for bad in (f"{SCHEME}", f"{SCHEME} ", f"Bearer {cred}", f"{SCHEME} {cred};rm -rf /", f"{SCHEME} MUNGE:x:",
                f"{SCHEME} {cred[:-1]}", f"{SCHEME} MUNGE:{'A' * 9000}:"):
        assert reason(v, "node_get", headers={"Authorization": bad}) == "malformed_credentials", bad
    assert munge.decodes == 0


def test_refused_credentials_do_not_fill_the_cache_and_a_full_cache_fails_closed() -> None:
    v = verifier(max_entries=1)
    for name in ("other_user", "long_ttl", "expired", "tampered"):
        reason(v, name)
    v.verify(*request_of("node_get")[:2], header("node_get"), b"", at("node_get"))
    assert reason(v, "mig_apply") == "too_many_requests"
    encoded = CASES["node_get"]["decoded"]["encode_time"]
    v._forget_expired(encoded + 60 + 30)  # noqa: SLF001 -- at the edge of node_get's TTL and skew: kept
    assert len(v._seen) == 1  # noqa: SLF001
    v._forget_expired(encoded + 60 + 30 + 1)  # noqa: SLF001 -- past it: forgotten, the cache has room again
    assert len(v._seen) == 0  # noqa: SLF001


# ---- the controller's side --------------------------------------------------------------------------------------


def test_the_client_signs_with_a_credential_bound_to_the_request() -> None:
    auth = MungeClientAuth(RecordedMunge(), ROOT_UID)
    headers, rid = auth.sign(*request_of("node_get"), now=0)
    assert headers == header("node_get") and rid == request_id(CASES["node_get"]["credential"])
    with pytest.raises(MungeError):  # no credential for another payload: nothing is reused
        auth.sign("GET", "/v1/other", b"", now=0)


def test_the_client_accepts_only_an_answer_from_the_agent_user_for_this_request_and_body() -> None:
    answer = CASES["node_get_answer"]
    rid, body, cred = answer["request_id"], base64.b64decode(answer["body"]), answer["credential"]
    assert MungeClientAuth(RecordedMunge(), ROOT_UID).check_response(rid, body, cred)
    refused = {
        "other agent user": (MungeClientAuth(RecordedMunge(), NOBODY_UID), rid, body, cred),
        "other body": (MungeClientAuth(RecordedMunge(), ROOT_UID), rid, body + b" ", cred),
        "other request": (MungeClientAuth(RecordedMunge(), ROOT_UID), "0" * 64, body, cred),
        "unsigned": (MungeClientAuth(RecordedMunge(), ROOT_UID), rid, body, None),
        "bad credential": (MungeClientAuth(RecordedMunge(), ROOT_UID), rid, body, CASES["other_key"]["credential"]),
        "garbage": (MungeClientAuth(RecordedMunge(), ROOT_UID), rid, body, "MUNGE:..;:"),
    }
    refused["a request credential"] = (MungeClientAuth(RecordedMunge(), ROOT_UID), rid, body,
                                       CASES["node_get"]["credential"])
    for what, (auth, r, b, c) in refused.items():
        assert not auth.check_response(r, b, c), what


class _BodySampler:
    node, interval_s = "n1", 5.0

    def __init__(self, body: bytes) -> None:
        self.body = body

    def sample_once(self) -> None:
        """The body is fixed."""

    def latest(self) -> tuple[None, bytes]:
        return None, self.body

    def snapshot(self) -> tuple[None, AgentCounters]:
        return None, AgentCounters()


def test_agent_and_client_over_http_with_recorded_credentials() -> None:
    """The real AgentApp with the MUNGE verifier and the real AgentClient: the recorded GET gets the recorded,
    credentialed answer; every hostile variant gets 401 without data."""
    body = base64.b64decode(CASES["node_get_answer"]["body"])
    verify = MungeRequestVerifier(RecordedMunge(), ROOT_UID)
    app = AgentApp(_BodySampler(body), verify, clock=lambda: at("node_get"))

    async def main() -> None:
        async with TestServer(app.build(), host="127.0.0.1") as server, aiohttp.ClientSession() as s:
            url = str(server.make_url(NODE_PATH))
            hostile = {"none": {}, "hmac": sign_request(b"k" * 48, "GET", NODE_PATH, b"", now=at("node_get")),
                       "other user": header("other_user"), "expired": header("expired"),
                       "replayed at munged": header("replayed_at_munged"), "tampered": header("tampered"),
                       "other key": header("other_key"), "lifted from a POST": header("mig_apply"),
                       "ttl too long": header("long_ttl")}
            for what, h in hostile.items():
                async with s.get(url, headers=h) as resp:
                    answer = await resp.read()
                    assert resp.status == 401, what
                    assert resp.headers["WWW-Authenticate"].startswith(f"{SCHEME} error="), what
                    assert b"n1" not in answer and HEADER_SIGNATURE not in resp.headers, what
            async with AgentClient(MungeClientAuth(RecordedMunge(), ROOT_UID), timeout_s=10) as client:
                report = await client.fetch(str(server.make_url("/")))
                assert isinstance(report, NodeReport) and report.node == "n1"
                with pytest.raises(AgentAuthError, match="replayed_credential"):  # the same credential again
                    await client.fetch(str(server.make_url("/")))
            async with AgentClient(MungeClientAuth(RecordedMunge(), NOBODY_UID), timeout_s=10) as client:
                verify._seen.clear()  # noqa: SLF001 -- the same recorded request once more, for another check
                with pytest.raises(AgentAuthError, match="not signed"):  # the answer is not from the agent user
                    await client.fetch(str(server.make_url("/")))

    asyncio.run(main())


# ---- configuration ----------------------------------------------------------------------------------------------


def test_users_resolve_by_name_or_uid() -> None:
    assert resolve_uid("root", "x") == 0 and resolve_uid("65534", "x") == 65534 and resolve_uid(12, "x") == 12
    with pytest.raises(ConfigError, match="munge_controller_user: no user 'no-such-user-h16'"):
        resolve_uid("no-such-user-h16", "munge_controller_user")


def test_agent_and_controller_configs_name_the_same_kinds(tmp_path: Path) -> None:
    cfg = load_config(None, {"auth": "munge", "munge_controller_user": "svc", "munge_max_ttl_s": 120}, "n1")
    assert (cfg.auth, cfg.munge_controller_user, cfg.munge_max_ttl_s) == ("munge", "svc", 120)
    assert load_config(None, {}, "n1").auth == "hmac"
    for bad, match in (({"auth": "kerberos"}, "auth must be 'hmac' or 'munge'"),
                       ({"munge_max_ttl_s": 0}, "munge_max_ttl_s must be within 1..3600"),
                       ({"munge_controller_user": " "}, "munge_controller_user must not be empty")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, bad, "n1")
    toml = tmp_path / "controller.toml"
    toml.write_text('version = 1\n[agents]\nauth = "munge"\nmunge_agent_user = "root"\nmunge_ttl_s = 30\n')
    agents = load_controller_config(toml).agents
    assert (agents.auth, agents.munge_agent_user, agents.munge_ttl_s, agents.key_file) == ("munge", "root", 30,
                                                                                       Path(AGENT_KEY_FILE))
    toml.write_text('version = 1\n[agents]\nauth = "krb5"\n')
    with pytest.raises(ConfigError, match="auth.*must be 'hmac' or 'munge'"):
        load_controller_config(toml)
    toml.write_text('version = 1\n[agents]\nmunge_ttl_s = 0\n')
    with pytest.raises(ConfigError, match="munge_ttl_s"):
        load_controller_config(toml)


def test_the_controller_refuses_to_start_without_a_reachable_munged(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agents.auth = \"munge\":.*munge status.*/nonexistent/munge.sock"):
        client_auth("munge", key_file=None, munge_socket="/nonexistent/munge.sock", munge_agent_user="root",
                    munge_ttl_s=60, source="c.toml")
    with pytest.raises(ConfigError, match=r"c\.toml: agents\.key_file: key file .*none\.key does not exist"):
        client_auth("hmac", key_file=tmp_path / "none.key", munge_socket="", munge_agent_user="root", munge_ttl_s=60,
                    source="c.toml")

