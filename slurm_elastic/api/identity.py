"""Turning a peer uid into a Caller (user name and group names) through the system's user database."""

from __future__ import annotations

import grp
import os
import pwd

from slurm_elastic.api.authz import Caller


def caller_for_uid(uid: int) -> Caller:
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return Caller(uid=uid, user=str(uid))
    names: set[str] = set()
    try:
        for gid in os.getgrouplist(pw.pw_name, pw.pw_gid):
            try:
                names.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
    except OSError:
        pass
    return Caller(uid=uid, user=pw.pw_name, groups=frozenset(names))
