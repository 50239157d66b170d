"""Whether an ``s3://`` run can be read at all, in one line: before any job starts.

An unreachable endpoint or missing credentials otherwise surface deep in the first job that lists the run, as
a chained traceback of botocore and aiobotocore frames.  :func:`remote_problem` lists the run's prefix once
(bounded by ``timeout_s``) and names the cause by the exception classes botocore and aiohttp raise (matched by
name through the chain, so none of them is imported here).
"""

from __future__ import annotations

import concurrent.futures
from typing import Optional

from .remote import filesystem, split_url

_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "NoAuthTokenError",
                "ProfileNotFound")
_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ClientConnectorError",
                "ServerDisconnectedError", "ConnectionRefusedError", "ConnectionError", "gaierror", "TimeoutError")


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def remote_problem(url: str, endpoint: str = "", timeout_s: float = 30.0) -> Optional[str]:
    """One line saying why the run at ``url`` cannot be listed (no credentials, an endpoint that does not
    answer, access denied, no such bucket), or None when it can (an empty or missing prefix included: the
    inventory says that in its own words)."""
    protocol, root = split_url(url)
    where = f" at {endpoint}" if endpoint else ""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ckptaudit-s3-reach")
    try:
        pool.submit(lambda: filesystem(protocol).ls(root.split("/", 1)[0], detail=False)).result(timeout=timeout_s)
        return None
    except concurrent.futures.TimeoutError:
        return f"the S3 endpoint{where} did not answer within {timeout_s:g} s listing {url}"
    except BaseException as e:  # noqa: BLE001 - every cause becomes one line
        names = [type(x).__name__ for x in _chain(e)]
        last = next(iter(_chain(e)))
        if any(n in _CREDENTIALS for n in names):
            return (f"no AWS credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE "
                    "(or s3.profile), use ~/.aws or an instance role; s3.anon: true for a public bucket")
        if any(n in _UNREACHABLE for n in names):
            return f"cannot reach the S3 endpoint{where} for {url}: {type(last).__name__}: {str(last)[:200]}"
        if isinstance(e, PermissionError):
            return f"access to {url} denied: {str(e)[:200]}"
        if isinstance(e, FileNotFoundError):
            return f"{url}: the bucket does not exist{where}"
        return f"{url} cannot be listed: {type(last).__name__}: {str(last)[:200]}"
    finally:
        pool.shutdown(wait=False)
