"""Where the server listens: its address and port, TLS, and the WebRTC calls' UDP ports and announced address.

The first part of :class:`~._settings.ServerSettings` (which extends it), declared here to keep each module one
sitting long; the command line shows them in the ``listening`` group.
"""

from __future__ import annotations

import dataclasses
import pathlib

from .._setting import setting
from ..engine import ActorSettings
from ._setting_types import parse_port_range


@dataclasses.dataclass
class ListeningSettings(ActorSettings):
    """The settings of where and how the server is reached (see the module's doc)."""

    host: str = setting("127.0.0.1", "address to listen on, 0.0.0.0 for all", group="listening", metavar="ADDRESS")
    port: int = setting(8998, "port; 0 picks a free one", low=0, high=65535, group="listening", metavar="N")
    ssl_dir: pathlib.Path | None = setting(
        None,
        "serve HTTPS and WSS with DIR/cert.pem and DIR/key.pem (a self-signed pair is made there when "
        "both are missing)",
        flag="--ssl",
        group="listening",
        metavar="DIR",
    )
    certfile: pathlib.Path | None = setting(
        None,
        "serve HTTPS and WSS with this certificate (PEM, the chain after it); needs --keyfile",
        group="listening",
        metavar="FILE",
    )
    keyfile: pathlib.Path | None = setting(
        None, "the private key of --certfile (PEM, unencrypted)", group="listening", metavar="FILE"
    )
    webrtc_host: str | None = setting(
        None,
        "the address WebRTC callers reach this server at, announced in its ICE candidates (behind NAT: the "
        "public one; docs/DEPLOY.md); unset: the machine's own",
        group="listening",
        advanced=True,
        metavar="ADDRESS",
    )
    webrtc_ports: str | None = setting(
        None,
        "UDP ports for WebRTC calls, FIRST-LAST, one per call (open them in the firewall; docs/DEPLOY.md); "
        "unset: any the kernel gives",
        group="listening",
        advanced=True,
        metavar="FIRST-LAST",
    )

    @property
    def webrtc_port_range(self) -> range | None:
        """``--webrtc-ports`` as the ports it names (None: the kernel's choice)."""
        return None if self.webrtc_ports is None else parse_port_range(self.webrtc_ports)
