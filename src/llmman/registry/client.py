"""A synchronous OCI distribution client: auth, manifests, blob GET/HEAD/upload.

Sources: OCI distribution-spec 1.1 ("Pulling manifests", "Pulling blobs", "Pushing blobs", "Pushing
manifests"), Docker's token authentication (``WWW-Authenticate: Bearer realm=…,service=…,scope=…`` then
``GET realm?service=&scope=`` answering ``token``/``access_token``), and basic auth (RFC 7617).

Transport: HTTPS verified against the system trust store plus ``tls.ca_file`` (``LLMMAN_TLS_CA``, a PEM
file); plain HTTP for an ``insecure`` registry (``--insecure``, ``"insecure": true`` in ``/api/pull``, or a
host listed in ``registry.insecure_registries``, ``LLMMAN_INSECURE_REGISTRIES``); both settings reach the
client as :class:`RegistryOptions`. A loopback registry (``localhost``, 127.0.0.0/8, ::1) is insecure by
default as in Docker (dockerd's ``--insecure-registry`` default includes 127.0.0.0/8): HTTPS is tried first
and a TLS handshake failure falls back to plain HTTP. Docker Hub's API host is ``registry-1.docker.io``.

Errors: :class:`RegistryError` with a summary of the registry's answer (:func:`summarise`: the status,
the OCI error code and a short cleaned message; never the raw body); 401/403 say which credentials
failed; 404 is :class:`RegistryNotFound`; connection failures name the host.

Offline (``server.offline``): an ``offline`` client connects to loopback hosts only (:func:`may_connect`),
checked for every request before any connection or name lookup: token realms, redirects (manifests and
blob storage), upload locations. :meth:`RegistryClient.confine` adds one more host a client may reach
(a configured peer's own address, any port of it).
"""

from __future__ import annotations

import http
import ipaddress
import json
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from llmman.config.environment import HF_DEFAULT_ENDPOINT
from llmman.errors import LlmmanError
from llmman.refs import Reference
from llmman.registry.credentials import Credential, CredentialStore
from llmman.store import mediatypes as mt
from llmman.tls import client_context, trust_ca

if TYPE_CHECKING:
    from llmman.config.settings import Settings

MANIFEST_ACCEPT = ", ".join([mt.OCI_MANIFEST, mt.OCI_INDEX, mt.DOCKER_MANIFEST, mt.DOCKER_MANIFEST_LIST])
CONNECT_TIMEOUT_S = 10.0
STALL_TIMEOUT_S = 60.0  # a read that gets no byte for this long fails (and is retried)
BLOB_REDIRECT = "x-llmman-blob-redirect"  # "1": an llmman node may send a blob GET to its blob server
_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(LlmmanError):
    """A registry refused or failed a request (status 502 unless the registry's status says more)."""

    status = 502
    code = "registry_error"


class RegistryUnavailable(RegistryError):
    """A transient failure: the connection failed or stalled, or the registry answered 5xx/429."""

    status = 503
    code = "registry_unavailable"


class RegistryNotFound(RegistryError):
    """The repository, tag or blob does not exist on the registry."""

    status = 404
    code = "not_found"


class RegistryAuthError(RegistryError):
    """401/403 from a registry or its token service."""

    status = 401
    code = "unauthorized"


class OfflineRefused(RegistryError):
    """``server.offline``: a connection off this machine was about to be made (refused before it)."""

    status = 503
    code = "offline"


def may_connect(host: str) -> bool:
    """True when connecting to ``host`` (a name or address, no port) stays on this machine: a loopback
    address, or ``localhost``/``*.localhost`` when every address it resolves to is loopback. Any other
    name is refused without being looked up."""
    name = host.strip("[]").lower()
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        pass
    if name != "localhost" and not name.endswith(".localhost"):
        return False
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


class _Guarded(httpx.BaseTransport):
    """The client's transport, asking :meth:`RegistryClient.check_destination` before every request
    (redirects and the token service included)."""

    def __init__(self, owner: RegistryClient, inner: httpx.BaseTransport) -> None:
        self.owner, self.inner = owner, inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.owner.check_destination(str(request.url))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,39}")
_UNSAFE = re.compile(r"[^A-Za-z0-9 .,:;_/()'-]+")


def _clip(text: str, limit: int = 80) -> str:
    """``text`` on one line, without control or markup characters, at most ``limit`` characters."""
    clean = " ".join(_UNSAFE.sub(" ", text).split())
    return clean if len(clean) <= limit else clean[: limit - 1].rstrip() + "…"


def summarise(status: int, body: bytes) -> str:
    """A short, safe account of an error answer: ``<status> <reason>``, plus the first OCI error's
    ``code`` (``MANIFEST_UNKNOWN``, ``DENIED``: an upper-case word) when the body is OCI's
    ``{"errors": [...]}`` JSON. Nothing else of a body (its messages, HTML pages, stack traces) is
    repeated."""
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "error"
    out = f"{status} {reason}"
    try:
        doc = json.loads(body[:65536]) if body.lstrip()[:1] == b"{" else None
    except ValueError:
        doc = None
    errors = doc.get("errors") if isinstance(doc, dict) else None
    first = errors[0] if isinstance(errors, list) and errors and isinstance(errors[0], dict) else None
    code = first.get("code") if first is not None else None
    if isinstance(code, str) and _CODE.fullmatch(code):
        out += f" ({code})"
    return out


@dataclass(frozen=True)
class RegistryOptions:
    """How registries are reached, as configured; the default is "nothing configured".

    Attributes:
        insecure_registries: hosts (``host[:port]``) spoken to over plain HTTP
            (``registry.insecure_registries``); matched case-insensitively.
        ca_file: a PEM CA bundle trusted on top of the system store (``tls.ca_file``); empty = none.
        hf_endpoint: the Hugging Face endpoint (``HF_ENDPOINT``).
    """

    insecure_registries: tuple[str, ...] = ()
    ca_file: str = ""
    hf_endpoint: str = HF_DEFAULT_ENDPOINT

    @classmethod
    def of(cls, settings: Settings) -> RegistryOptions:
        """The options ``settings`` configure."""
        return cls(insecure_registries=settings.insecure_registries, ca_file=settings.ca_file,
                   hf_endpoint=settings.environment.hf_endpoint)

    def is_insecure(self, registry: str) -> bool:
        """True when ``registry`` is listed in :attr:`insecure_registries`."""
        return registry.lower() in {host.lower() for host in self.insecure_registries}


def api_host(registry: str) -> str:
    """The host serving the registry API (``docker.io`` -> ``registry-1.docker.io``)."""
    return "registry-1.docker.io" if registry == "docker.io" else registry


class RegistryClient:
    """Talks to one registry host on behalf of one repository's pulls and pushes. Thread-safe.

    Args:
        registry: host[:port] as in :attr:`Reference.registry`.
        credentials: where to find a user/password; None means anonymous only.
        insecure: use plain HTTP.
        options: the configured insecure hosts (plain HTTP too) and extra CA bundle.
    """

    def __init__(self, registry: str, credentials: CredentialStore | None = None, *,
                 insecure: bool = False, stall_timeout: float = STALL_TIMEOUT_S,
                 credential: Credential | None = None, options: RegistryOptions | None = None,
                 offline: bool = False) -> None:
        self.registry = registry
        self.offline = offline  # loopback hosts only (see check_destination)
        self._also: set[str] = set()
        options = options or RegistryOptions()
        insecure = insecure or options.is_insecure(registry)
        self.base = f"{'http' if insecure else 'https'}://{api_host(registry)}"
        self.loopback = is_loopback_host(registry)  # HTTPS that fails its handshake falls back to plain HTTP
        self.stall_timeout = stall_timeout
        self.tls = None if insecure else client_context(options.ca_file)
        self._trusted = {options.ca_file} if options.ca_file else set()
        self._cred = credential or (credentials.get(registry) if credentials else None)
        self._tokens: dict[str, str] = {}
        self._basic = False
        self._lock = threading.Lock()
        timeout = httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=stall_timeout, write=stall_timeout, pool=None)
        inner = httpx.HTTPTransport(verify=self.tls if self.tls is not None else True,
                                    limits=httpx.Limits(max_connections=16))
        self.http = httpx.Client(timeout=timeout, follow_redirects=True, transport=_Guarded(self, inner))

    def confine(self, *, also: str = "") -> None:
        """From now on connect only to loopback hosts, and to the host of ``also`` (``host[:port]``)
        when given, on any port: an llmman peer sends blob GETs to its blob server's own port."""
        self.offline = True
        if also and (host := urlsplit(f"//{also}").hostname):
            self._also.add(host.lower())

    def check_destination(self, url: str) -> None:
        """Raise :class:`OfflineRefused` when this client is offline and ``url``'s host is off this
        machine (:func:`may_connect`); called before every connection, no name is looked up first."""
        if not self.offline:
            return
        parts = urlsplit(url)
        host = parts.hostname or ""
        if host.lower() in self._also or may_connect(host):
            return
        raise OfflineRefused(f"{self.registry}: not connecting to {_clip(host, 100)}: llmman is offline "
                             "(server.offline) and that host is not on this machine")

    def close(self) -> None:
        self.http.close()

    def trust(self, ca_file: str) -> None:
        """Also trust the PEM bundle ``ca_file`` from now on (nothing for plain HTTP or an empty name;
        a bundle is loaded once). Raises ConfigError when it cannot be read."""
        if self.tls is None or not ca_file or ca_file in self._trusted:
            return
        trust_ca(self.tls, ca_file)
        self._trusted.add(ca_file)

    # -- auth ------------------------------------------------------------------------------------
    def auth_headers(self, scope: str) -> dict[str, str]:
        """The Authorization header this client would send now for ``scope`` (empty when anonymous)."""
        return self._auth_headers(scope)

    def _auth_headers(self, scope: str) -> dict[str, str]:
        with self._lock:
            token = self._tokens.get(scope)
            basic = self._basic
        if token:
            return {"Authorization": f"Bearer {token}"}
        if basic and self._cred is not None:
            return {"Authorization": _basic(self._cred)}
        return {}

    def _authenticate(self, response: httpx.Response, scope: str) -> None:
        """Answer a 401 challenge: fetch a bearer token for ``scope`` or switch to basic auth."""
        challenge = response.headers.get("www-authenticate", "")
        kind, _, rest = challenge.partition(" ")
        if kind.lower() == "basic":
            if self._cred is None:
                raise RegistryAuthError(f"{self.registry}: authentication required (run `llmman login "
                                        f"{self.registry}`)")
            with self._lock:
                if self._basic:
                    raise RegistryAuthError(f"{self.registry}: 401 unauthorized: wrong user name or password")
                self._basic = True
            return
        if kind.lower() != "bearer":
            raise RegistryAuthError(f"{self.registry}: 401 unauthorized (no usable WWW-Authenticate "
                                    "challenge)")
        params = dict(_PARAM.findall(rest))
        realm = params.get("realm")
        if not realm:
            raise RegistryAuthError(f"{self.registry}: bearer challenge without realm")
        query = {"service": params.get("service", ""), "scope": params.get("scope") or scope}
        headers = {"Authorization": _basic(self._cred)} if self._cred is not None else {}
        try:
            answer = self.http.get(realm, params=query, headers=headers)
        except httpx.HTTPError as exc:
            raise RegistryError(f"{self.registry}: token service {_clip(realm, 100)} unreachable: "
                                f"{_describe(exc)}") from exc
        if answer.status_code in (401, 403):
            raise RegistryAuthError(f"{self.registry}: token service refused the credentials "
                                    f"({answer.status_code})")
        if answer.status_code != 200:
            raise RegistryError(f"{self.registry}: token service answered {answer.status_code}")
        body = answer.json()
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.registry}: token service sent no token")
        with self._lock:
            if self._tokens.get(scope) == token:
                raise RegistryAuthError(f"{self.registry}: 401 unauthorized for {scope}")
            self._tokens[scope] = token

    @contextmanager
    def request(self, method: str, path: str, *, scope: str, headers: dict[str, str] | None = None,
                content: Any = None, stream: bool = False) -> Iterator[httpx.Response]:
        """One request with auth (retried once per challenge). Yields the response (open when
        ``stream``); maps 401/403/404 and transport failures to :class:`RegistryError` subclasses."""
        url = path if path.startswith("http") else self.base + path
        for _ in range(4):  # a loopback HTTPS-to-HTTP fallback, two auth challenges, the answer
            send_headers = {**(headers or {}), **self._auth_headers(scope)}
            try:
                req = self.http.build_request(method, url, headers=send_headers, content=content)
                response = self.http.send(req, stream=stream)
            except httpx.HTTPError as exc:
                if _tls_failed(exc) and url.startswith("https://") and self._plain_http_fallback():
                    url = "http://" + url.removeprefix("https://")
                    continue
                raise RegistryUnavailable(f"{self.registry}: {_describe(exc, self.loopback)}") from exc
            if response.status_code == 401:
                response.close()
                self._authenticate(response, scope)
                continue
            try:
                if response.status_code == 403:
                    raise RegistryAuthError(f"{self.registry}: 403 forbidden for {scope}")
                if response.status_code == 404:
                    raise RegistryNotFound(f"{self.registry}{path.split('?')[0]}: not found")
                yield response
            finally:
                response.close()
            return
        raise RegistryAuthError(f"{self.registry}: 401 unauthorized")

    def _plain_http_fallback(self) -> bool:
        """Switch a loopback registry to plain HTTP after a TLS failure; False for any other host."""
        if not self.loopback:
            return False
        with self._lock:
            self.base = "http://" + self.base.removeprefix("https://")
        return True

    def check_login(self) -> None:
        """``GET /v2/`` with the credential (a token for no scope when challenged): raises
        RegistryAuthError when the registry refuses it, RegistryError when it cannot be reached."""
        with self.request("GET", "/v2/", scope="") as response:
            check(response, "login")

    # -- manifests -------------------------------------------------------------------------------
    def get_manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        """``GET /v2/<name>/manifests/<reference>`` -> (bytes, media type)."""
        scope = f"repository:{repository}:pull"
        with self.request("GET", f"/v2/{repository}/manifests/{reference}", scope=scope,
                          headers={"Accept": MANIFEST_ACCEPT}) as response:
            check(response, "manifest")
            media = response.headers.get("content-type", "").split(";")[0].strip()
            return response.content, media


def check(response: httpx.Response, what: str) -> None:
    """Raise RegistryError for a non-2xx answer, with a summary of it (:func:`summarise`)."""
    if response.status_code < 300:
        return
    if not response.is_closed:
        response.read()
    text = summarise(response.status_code, response.content)
    if response.status_code >= 500 or response.status_code == 429:
        raise RegistryUnavailable(f"{what}: registry answered {text}")
    raise RegistryError(f"{what}: registry answered {text}")


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses, with or without a ``:port`` (IPv6 in brackets)."""
    name = host.strip()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name.lower() == "localhost" or name.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _tls_failed(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a TLS handshake failure other than a certificate
    refusal, e.g. ``[SSL: WRONG_VERSION_NUMBER]`` from a registry that speaks plain HTTP."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return False
        if isinstance(seen, ssl.SSLError) or "[SSL" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(exc: BaseException, loopback: bool = False) -> str:
    """A one-line reason for a transport failure (httpx messages are often empty); a TLS failure says
    how to reach a plain-HTTP registry."""
    text = str(exc) or type(exc).__name__
    if _tls_failed(exc) and not loopback:
        return (f"TLS handshake failed: {text} (a plain-HTTP registry? use --insecure, \"insecure\": true, "
                "or list the host in LLMMAN_INSECURE_REGISTRIES)")
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {text}"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out: {text}"
    return f"{type(exc).__name__}: {text}"


def _basic(cred: Credential) -> str:
    import base64

    raw = f"{cred.username}:{cred.password}".encode()
    return "Basic " + base64.b64encode(raw).decode()


def reference_tag(ref: Reference) -> str:
    """What to ask the registry for: the digest when pinned, else the tag."""
    return ref.digest or ref.tag
