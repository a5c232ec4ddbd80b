"""The cluster token every call carries: $TESSEL_TOKEN, else the token file next to the cluster's state.

Kept apart from `rpc` (gRPC and protobuf) so that a launcher finds the token without loading either: `tessel run`
starts its ranks before it ever dials anyone.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from tessel.core import errors


def token_path() -> Path:
    return Path(os.environ.get("TESSEL_HOME", Path.home() / ".tessel")) / "token"


def cluster_token(create: bool = False) -> str:
    """The cluster token: $TESSEL_TOKEN, else the token file (~/.tessel/token), else a new one if `create`."""
    value = os.environ.get("TESSEL_TOKEN")
    if value is not None and value.strip():
        return value
    if value is not None and value != "":
        raise errors.ConfigurationError("TESSEL_TOKEN is blank; an empty token would switch authentication off")
    path = token_path()
    if path.exists():
        token = path.read_text().strip()
        if not token:  # `echo $UNSET > ~/.tessel/token`: an empty token would let anyone call
            raise errors.ConfigurationError(
                f"the token file {path} is empty; an empty token would switch authentication off. Remove the file "
                "(the coordinator writes a new one) or write the cluster's token into it"
            )
        return token
    if not create:
        raise errors.ConfigurationError(
            "no cluster token: set TESSEL_TOKEN to the token the coordinator was started with "
            f"(or run on the coordinator's host, where it is in {path})"
        )
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the token, the TLS keys and the job records
    # The processes of a job started together (a dynamic cluster's scheduler and workers) may all create it at
    # once: each writes its own file and links it into place, the first link wins and everyone reads the winner's.
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16) + "\n")
    try:
        os.link(temp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(temp)
    return path.read_text().strip()
