"""Reading image references under a policy: what a caller may point the server at.

An image reference is a string from whoever calls the graph: a local path, a ``file://``,
``data:`` or ``http(s)://`` URL, or a ``blob://`` key of the image store. When the graph is
served to strangers, a reference is an attack surface: a path reads server files, a URL
makes the server fetch from its private network (server-side request forgery), a slow or
endless body holds a worker, and error messages can leak what exists on the server or the
credentials inside a URL. :class:`ImagePolicy` says what is allowed; the readers here
enforce it:

- files: only when allowed, only under ``file_roots`` when set (resolved, so ``..`` and
  symlinks cannot leave them), only regular files (a FIFO or device is refused without
  blocking), at most ``max_bytes``;
- URLs: the scheme must be allowed; every address the host resolves to must be public unless
  private hosts are allowed or the host is allow-listed; the connection goes to the address
  that was checked (no DNS rebinding between check and use); redirects are followed by hand
  and each hop is checked again; one total deadline covers DNS, connect, redirects and the
  body, and the body is cut off at ``max_bytes``;
- errors name the reference with credentials and query strings removed, and a refused path
  gets the same message whether or not the file exists.

Proxies (``HTTP_PROXY``) are not used: a proxy would defeat the address checks.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import os
import socket
import ssl
import stat
import threading
import time
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path

from .deadlines import time_left

__all__ = [
    "FileInfo",
    "ImageLoadError",
    "ImagePolicy",
    "ImagePolicyError",
    "fetch_url",
    "read_data_url",
    "read_file",
    "redact",
    "resolve_file",
    "stat_file",
]


class ImageLoadError(RuntimeError):
    """An image reference could not be turned into pixels (recorded as the query's error)."""


class ImagePolicyError(ImageLoadError):
    """The image policy does not allow this reference."""


@dataclass(frozen=True)
class ImagePolicy:
    """Which image references are opened, and how much is read.

    The default suits local use (your own files and URLs); :meth:`strict` suits a graph
    served to strangers: ``data:`` URLs and public ``https`` only, unless folders or hosts
    are allow-listed.
    """

    allow_data_urls: bool = True
    allow_https: bool = True
    allow_http: bool = True
    allow_private_hosts: bool = True  # loopback, private, link-local (cloud metadata), ...
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)  # "host" or "host:port"
    allow_files: bool = True
    file_roots: tuple[str, ...] = ()  # when set, files only inside these folders
    max_bytes: int = 64 * 2**20  # encoded size of one image (file, download or data URL)
    max_pixels: int = 64_000_000  # decoded size of one image (an 8K frame is 33 MP)
    fetch_timeout_s: float = 20.0  # total: DNS, connect, redirects and body
    max_redirects: int = 3

    @classmethod
    def strict(
        cls,
        *,
        file_roots: tuple[str, ...] | list[str] = (),
        allowed_hosts: tuple[str, ...] | list[str] | frozenset[str] = (),
        **overrides,
    ) -> ImagePolicy:
        """For untrusted callers: ``data:`` and public ``https`` URLs; files only in ``file_roots``."""
        roots = tuple(str(Path(r).resolve()) for r in file_roots)
        return cls(
            allow_http=False,
            allow_private_hosts=False,
            allowed_hosts=frozenset(h.lower() for h in allowed_hosts),
            allow_files=bool(roots),
            file_roots=roots,
            **overrides,
        )

    def with_(self, **changes) -> ImagePolicy:
        return replace(self, **changes)

    def describe(self) -> str:
        """What is accepted, for error messages."""
        kinds = []
        if self.allow_data_urls:
            kinds.append("data: URLs")
        if self.allow_https:
            kinds.append("https URLs" + ("" if self.allow_private_hosts else " of public hosts"))
        if self.allow_http:
            kinds.append("http URLs")
        if self.allow_files:
            kinds.append("files in allowed folders" if self.file_roots else "local files")
        return ", ".join(kinds) or "nothing"


def redact(ref: str, limit: int = 120) -> str:
    """A reference fit for an error message: no credentials, no query string, bounded length."""
    if ref.startswith("data:"):
        return ref.partition(",")[0] + ",..."
    if "://" in ref and not ref.startswith("file://"):
        try:
            parts = urllib.parse.urlsplit(ref)
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = host + (f":{parts.port}" if parts.port else "")
            ref = urllib.parse.urlunsplit(
                (parts.scheme, netloc, parts.path, "..." if parts.query else "", "")
            )
        except ValueError:
            ref = ref.split("://", 1)[0] + "://(malformed URL)"
    return ref if len(ref) <= limit else ref[: limit - 3] + "..."


# --- data: URLs ------------------------------------------------------------------------------


def read_data_url(ref: str, policy: ImagePolicy) -> bytes:
    if not policy.allow_data_urls:
        raise ImagePolicyError(f"data: URLs are not accepted here (accepted: {policy.describe()})")
    header, sep, payload = ref.partition(",")
    if not sep:
        raise ImageLoadError("malformed data: URL (no comma)")
    if len(payload) > policy.max_bytes * 4 // 3 + 4:
        raise ImageLoadError(
            f"data: URL is larger than the {policy.max_bytes // 2**20} MiB image limit"
        )
    if ";base64" in header:
        try:
            return base64.b64decode(payload, validate=False)
        except (binascii.Error, ValueError) as exc:
            raise ImageLoadError(f"bad base64 in data: URL: {exc}") from None
    return urllib.parse.unquote_to_bytes(payload)


# --- files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileInfo:
    path: str  # resolved
    size: int
    mtime_ns: int

    @property
    def cache_key(self) -> tuple:
        """What identifies the file's content: a rewrite under the same name is a new image."""
        return ("file", self.path, self.size, self.mtime_ns)


def _file_path(ref: str) -> str:
    if ref.startswith("file://"):
        parts = urllib.parse.urlsplit(ref)
        if parts.netloc not in ("", "localhost"):
            raise ImageLoadError(f"file URLs must name a local file, got {redact(ref)}")
        return urllib.parse.unquote(parts.path)
    return ref


def resolve_file(ref: str, policy: ImagePolicy) -> FileInfo:
    """Check a path against the policy and stat it (without opening it)."""
    refused = ImagePolicyError(
        f"local file paths are not accepted here (accepted: {policy.describe()})"
    )
    if not policy.allow_files:
        raise refused
    given = _file_path(ref)
    if "\x00" in given:
        raise ImageLoadError("an image path cannot contain NUL characters")
    real = os.path.realpath(os.path.expanduser(given))
    if policy.file_roots and not any(_inside(real, root) for root in policy.file_roots):
        raise ImagePolicyError(
            f"image path {given!r} is outside the folders this deployment reads images from"
        )
    return stat_file(real, policy, given)


def stat_file(real: str, policy: ImagePolicy, given: str | None = None) -> FileInfo:
    """Stat a path :func:`resolve_file` has resolved and checked (the size and the
    modification time say whether it is still the same image)."""
    given = real if given is None else given
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise ImageLoadError(f"image file not found: {given!r}") from None
    except OSError as exc:
        raise ImageLoadError(f"could not read image file {given!r}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ImageLoadError(f"{given!r} is not a regular file")
    if st.st_size > policy.max_bytes:
        raise ImageLoadError(
            f"image file {given!r} is {st.st_size / 2**20:.1f} MiB; the limit is "
            f"{policy.max_bytes / 2**20:.0f} MiB"
        )
    return FileInfo(real, st.st_size, st.st_mtime_ns)


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def read_file(info: FileInfo, policy: ImagePolicy) -> bytes:
    """Read a resolved file; non-blocking open, so a FIFO swapped in after the check is refused."""
    try:
        fd = os.open(info.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ImageLoadError(f"could not read image file: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ImageLoadError("the image path is not a regular file")
        if st.st_size > policy.max_bytes:
            raise ImageLoadError(
                f"image file is {st.st_size / 2**20:.1f} MiB; the limit is "
                f"{policy.max_bytes / 2**20:.0f} MiB"
            )
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > policy.max_bytes:
                raise ImageLoadError("image file grew past the size limit while being read")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- http(s) -------------------------------------------------------------------------------


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to an address checked beforehand while sending the original Host header."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float):
        context = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address
        self._ssl_context = context

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._ssl_context.wrap_socket(sock, server_hostname=self.host)


def _resolve(host: str, port: int, timeout: float) -> list[str]:
    """getaddrinfo with a timeout (it has none of its own)."""
    result: list = []
    error: list = []

    def run() -> None:
        try:
            result.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            error.append(exc)

    t = threading.Thread(target=run, daemon=True, name="speceyes-dns")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise ImageLoadError(f"looking up {host!r} timed out")
    if error or not result:
        raise ImageLoadError(f"could not resolve host {host!r}")
    return list(dict.fromkeys(info[4][0] for info in result))


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def fetch_url(url: str, policy: ImagePolicy) -> bytes:
    """GET an image under the policy: checked addresses, re-checked redirects, total deadline."""
    budget = time_left(policy.fetch_timeout_s)
    deadline = time.monotonic() + (budget if budget is not None else policy.fetch_timeout_s)
    shown = redact(url)

    def too_slow() -> ImageLoadError:
        return ImageLoadError(
            f"fetching {shown} took longer than the time allowed ({budget or policy.fetch_timeout_s:.3g} s)"
        )

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise too_slow()
        return remaining

    for _hop in range(policy.max_redirects + 1):
        try:
            parts = urllib.parse.urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:
            raise ImageLoadError(f"malformed URL {shown}") from None
        scheme = parts.scheme.lower()
        if (
            scheme == "https"
            and not policy.allow_https
            or scheme == "http"
            and not policy.allow_http
        ):
            raise ImagePolicyError(
                f"{scheme} URLs are not accepted here (accepted: {policy.describe()})"
            )
        if scheme not in ("http", "https") or not host:
            raise ImageLoadError(f"cannot fetch {shown}: only http(s) URLs with a host")
        port = port or (443 if scheme == "https" else 80)
        host = host.lower()
        addresses = _resolve(host, port, left())
        trusted = (
            policy.allow_private_hosts
            or host in policy.allowed_hosts
            or f"{host}:{port}" in policy.allowed_hosts
        )
        if not trusted:
            addresses = [a for a in addresses if _is_public(a)]
            if not addresses:
                raise ImagePolicyError(
                    f"{shown} points at a private or local address, which this deployment "
                    "does not fetch from"
                )
        cls = _PinnedHTTPSConnection if scheme == "https" else _PinnedHTTPConnection
        conn = cls(host, port, addresses[0], timeout=left())
        try:
            target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
            conn.request(
                "GET", target, headers={"User-Agent": "speceyes-graph", "Accept": "image/*"}
            )
            sock = conn.sock  # kept: the connection drops it when the response will close
            resp = conn.getresponse()
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                if not location:
                    raise ImageLoadError(f"{shown} redirected without a Location")
                url = urllib.parse.urljoin(url, location)
                shown = redact(url)
                continue
            if resp.status != 200:
                raise ImageLoadError(f"could not fetch {shown}: HTTP {resp.status}")
            length = resp.getheader("Content-Length")
            if length and length.isdigit() and int(length) > policy.max_bytes:
                raise ImageLoadError(
                    f"{shown} is {int(length) / 2**20:.1f} MiB; the limit is "
                    f"{policy.max_bytes / 2**20:.0f} MiB"
                )
            chunks, total = [], 0
            while True:
                sock.settimeout(left())
                chunk = resp.read1(1 << 16)
                if not chunk:
                    break
                total += len(chunk)
                if total > policy.max_bytes:
                    raise ImageLoadError(
                        f"{shown} is larger than the {policy.max_bytes / 2**20:.0f} MiB limit"
                    )
                chunks.append(chunk)
            return b"".join(chunks)
        except TimeoutError:
            raise too_slow() from None
        except (OSError, http.client.HTTPException) as exc:
            raise ImageLoadError(f"could not fetch {shown}: {type(exc).__name__}") from None
        finally:
            conn.close()
    raise ImageLoadError(f"{shown}: more than {policy.max_redirects} redirects")
